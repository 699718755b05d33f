"""Simulated agents for bench/scale.py: many hosts in one process, speaking the real agent protocol through the real
broker, no TF and no task processes.

    .venv/bin/python bench/fleet_sim.py CONFIG.json

Per host, as worker_agent does, on the host's own keys (contracts/broker.py): a hello (on its events stream) then a
heartbeat (on its heartbeats stream) every `interval_s` (sealed HostReport with 8 simulated GPUs in the facts and the
task report: what runs, the unacknowledged exits, the last event number); orders read from its order queue (the
Celery message kombu put there) and admitted by the real OrderGate (Ed25519 signature, host, kind, freshness, seen
ids); for each launch a STARTED and (with a port) LISTENING task event, metric points at 1 Hz on its metrics stream,
and after a drawn duration an EXITED event and a recorded exit kept until acknowledged. Kills end the task with -9.
One thread reads every host's queue with one BRPOP (as kombu's Redis transport does); the main thread does all the
sending. The whole fleet signs in to Redis as one user (`redis_url`: 500 hosts' users would be 500 connections from
one process; what a host's user may do is tested in tests/security/test_host_credential.py).

On SIGTERM (or at `stop_at`) it writes its tallies, every launch order's (job, task, issued_at, received_at) and
every task's end here (task, ended_at) to `out`.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import heapq
import json
import math
import os
import queue
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from contracts import broker  # noqa: E402
from contracts.bundles import bundle_entries  # noqa: E402
from contracts.host_reports import (  # noqa: E402
    MAX_REPORTED_EXITS,
    GpuInfo,
    HostFacts,
    HostReport,
    RecordedExit,
    RunningTask,
    TaskReport,
    exit_acks_from,
)
from contracts.metric_messages import TaskMetricsBatch  # noqa: E402
from contracts.protocol import (  # noqa: E402
    AGENT_ACK_EXITS,
    AGENT_HEARTBEAT,
    AGENT_HELLO,
    AGENT_KILL,
    AGENT_LAUNCH,
    STREAM_MAXLEN,
    TASK_EVENT,
    TASK_METRICS,
    agent_queue,
    stream_entry,
)
from contracts.signing import Refused, agent_mac_key, load_public_key, seal  # noqa: E402
from contracts.task_messages import TaskEvent, TaskEventKind, kill_order_from, launch_spec_from  # noqa: E402
from worker_agent.orders import OrderGate  # noqa: E402

GPUS_PER_HOST = 8


@dataclass
class SimTask:
    job_id: int
    task_id: int
    attempt: int
    pid: int
    ends_at: float | None  # None: serves until killed (ParameterServer ps and workers)
    port: int | None = None
    devices: tuple[int, ...] = ()
    step: int = 0


@dataclass
class SimHost:
    name: str
    key: bytes
    gate: OrderGate
    port_range: tuple[int, int]
    next_beat: float
    hello_sent: bool = False
    seq: int = 0
    running: dict[tuple[int, int], SimTask] = field(default_factory=dict)
    exits: dict[tuple[int, int], RecordedExit] = field(default_factory=dict)
    seen: set[tuple[int, int]] = field(default_factory=set)  # launches applied (once per task and attempt)
    facts: dict[str, Any] = field(default_factory=dict)  # its HostFacts as a body: the same in every report


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclass_fields(cls))


def flat(obj: Any) -> dict[str, Any]:
    """`asdict` of a dataclass whose fields hold no dataclass and nothing another body shares (the task events, the
    recorded exits, the running tasks, a metrics batch of fresh points): the same body, without asdict's deep copy of
    every value (two thirds of the simulated fleet's CPU went to asdict)."""
    return {name: getattr(obj, name) for name in _field_names(type(obj))}


def sim_facts(name: str, port_range: tuple[int, int]) -> HostFacts:
    """What a simulated host reports of itself: 8 GPUs."""
    return HostFacts(
        cpu_count=64,
        memory_total_mb=512_000,
        gpus=[GpuInfo(i, "Simulated H100", 81_559, f"GPU-sim-{name}-{i}") for i in range(GPUS_PER_HOST)],
        tf_version="simulated",
        agent_version="fleet-sim",
        hostname=name,
        pid=os.getpid(),
        port_range=port_range,
    )


class Fleet:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.interval_s = float(config["interval_s"])
        self.duration = tuple(config["duration_s"])
        self.redis = redis.Redis.from_url(config["redis_url"])
        control_key = load_public_key(config["control_key"])
        workdir = Path(config["workdir"])
        now = time.time()
        rng = random.Random(config.get("seed", 0))
        self.hosts: dict[str, SimHost] = {}
        for entry in config["hosts"]:
            name = entry["name"]
            self.hosts[name] = SimHost(
                name=name,
                key=agent_mac_key(entry["token"], name),
                gate=OrderGate(control_key, name, workdir / name),
                port_range=(entry["port_min"], entry["port_max"]),
                next_beat=now + rng.uniform(0, self.interval_s),  # spread like agents started at random times
            )
        self.orders: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.ends: list[tuple[float, str, tuple[int, int]]] = []  # heap of (ends_at, host, key)
        self.launches: list[tuple[int, int, float, float]] = []
        self.exits: list[tuple[int, float]] = []  # (task id, when its process ended here): bench/scale.py's latencies
        self.tally: dict[str, int] = {
            "hellos": 0, "heartbeats": 0, "events": 0, "metric_entries": 0, "orders": 0, "refused": 0,
            "launches": 0, "kills": 0, "acks": 0, "send_failures": 0,
            "ports booked twice": 0, "devices booked twice": 0,
        }  # fmt: skip
        self.stopped = threading.Event()
        self._pid = 100_000

    # --- orders -----------------------------------------------------------------------------------------------------
    def consume(self) -> None:
        """Read every host's order queue, as kombu's Redis transport does (one BRPOP over all of them)."""
        keys = [agent_queue(name) for name in self.hosts]
        # One connection, the command packed once: redis-py packs every argument in Python on every call, and a BRPOP
        # naming every host's queue, once per order, was a third of this process's CPU. The same bytes go out.
        connection = redis.ConnectionPool.from_url(self.config["redis_url"]).make_connection()
        brpop = connection.pack_command("BRPOP", *keys, 1)
        while not self.stopped.is_set():
            try:
                connection.send_packed_command(brpop, check_health=False)
                got = connection.read_response()
            except redis.RedisError:
                connection.disconnect()
                time.sleep(0.5)
                continue
            if got is None:
                continue
            queue_name, raw = got
            host = broker.host_of_key(queue_name)
            try:
                message = json.loads(raw)
                body = json.loads(base64.b64decode(message["body"]))  # Celery protocol 2: [args, kwargs, embed]
                self.orders.put((host, {"task": message["headers"]["task"], "args": body[0]}))
            except (ValueError, KeyError, TypeError, IndexError):
                self.tally["refused"] += 1

    def handle_order(self, host_name: str, order: dict[str, Any], now: float) -> None:
        host = self.hosts[host_name]
        kind, args = order["task"], order["args"]
        self.tally["orders"] += 1
        try:
            body = host.gate.admit(args[0] if args else None, kind)
        except (Refused, OSError, IndexError):
            self.tally["refused"] += 1
            return
        if kind == AGENT_LAUNCH:
            spec = launch_spec_from(body)
            issued_at = float(json.loads(args[0]["order"])["issued_at"])
            self.launches.append((spec.job_id, spec.task_id, issued_at, now))
            key = (spec.task_id, spec.attempt)
            if key in host.seen:  # a resend: applied once per attempt, as the real agent does
                return
            host.seen.add(key)
            self.tally["launches"] += 1
            # What a real host would show as a bind failure or two processes on one GPU: booked twice.
            ports = {t.port for t in host.running.values() if t.port is not None}
            devices = {d for t in host.running.values() for d in t.devices}
            if spec.port is not None and spec.port in ports:
                self.tally["ports booked twice"] += 1
            if devices & set(spec.devices):
                self.tally["devices booked twice"] += 1
            self._pid += 1
            serves = spec.task_type == "ps" or (spec.task_type == "worker" and _has_chief(spec.env))
            drawn = random.Random(spec.job_id).uniform(*self.duration)  # a gang's tasks end together
            ends_at = None if serves else now + drawn + random.uniform(0, 0.5)
            host.running[key] = SimTask(
                spec.job_id, spec.task_id, spec.attempt, self._pid, ends_at, spec.port, tuple(spec.devices)
            )
            self._event(host, spec.task_id, spec.attempt, TaskEventKind.STARTED, pid=self._pid)
            if spec.port is not None:
                self._event(host, spec.task_id, spec.attempt, TaskEventKind.LISTENING, pid=self._pid)
            if ends_at is not None:
                heapq.heappush(self.ends, (ends_at, host_name, key))
        elif kind == AGENT_KILL:
            kill = kill_order_from(body)
            key = (kill.task_id, kill.attempt)
            self.tally["kills"] += 1
            if key in host.running:
                self._exit(host, key, -9, "killed")
            elif key not in host.exits and key not in host.seen:  # never started: recorded as over, never run
                host.seen.add(key)
                host.seq += 1
                host.exits[key] = RecordedExit(kill.job_id, kill.task_id, kill.attempt, host.seq, 0, -9, "killed")
                self._send(host, TASK_EVENT, flat(host.exits[key].as_event()))
        elif kind == AGENT_ACK_EXITS:
            self.tally["acks"] += 1
            for key in exit_acks_from(body):
                host.exits.pop(key, None)

    # --- what a host sends ------------------------------------------------------------------------------------------
    def _event(self, host: SimHost, task_id: int, attempt: int, kind: str, **fields: Any) -> None:
        host.seq += 1
        self._send(host, TASK_EVENT, flat(TaskEvent(task_id, attempt, kind, seq=host.seq, **fields)))

    def _exit(self, host: SimHost, key: tuple[int, int], code: int, detail: str = "") -> None:
        task = host.running.pop(key)
        self.exits.append((task.task_id, time.time()))
        host.seq += 1
        recorded = RecordedExit(task.job_id, task.task_id, task.attempt, host.seq, task.pid, code, detail)
        host.exits[key] = recorded
        self._send(host, TASK_EVENT, flat(recorded.as_event()))

    def _send(self, host: SimHost, name: str, body: dict[str, Any]) -> None:
        """As the agent's outbox: the hello and task events are entries of the host's events stream."""
        try:
            entry = stream_entry(name, seal(host.key, host.name, name, body))
            self.redis.xadd(broker.stream(host.name, broker.EVENTS), entry, maxlen=STREAM_MAXLEN[broker.EVENTS],
                            approximate=True)  # fmt: skip
        except Exception:  # the broker blinked: a real agent's outbox retries; the report repeats it
            self.tally["send_failures"] += 1
            return
        self.tally["events" if name == TASK_EVENT else "heartbeats" if name == AGENT_HEARTBEAT else "hellos"] += 1

    def beat(self, host: SimHost, pipe: Any) -> None:
        """The host's report; a heartbeat is added to `pipe` (the due hosts' beats go out in one round trip)."""
        if not host.facts:  # (a host's facts never change: made into a body once)
            host.facts = HostReport(sim_facts(host.name, host.port_range)).to_body()["facts"]
        tasks = TaskReport(
            running=[RunningTask(t.job_id, t.task_id, t.attempt, t.pid) for t in host.running.values()],
            exits=list(host.exits.values())[:MAX_REPORTED_EXITS],
            events_upto=host.seq,
        )
        # HostReport(facts, tasks).to_body(), made of the kept facts and the report's flat parts.
        report = {"running": [flat(r) for r in tasks.running], "exits": [flat(e) for e in tasks.exits],
                  "events_upto": tasks.events_upto}  # fmt: skip
        body = {"facts": host.facts, "tasks": report}
        if not host.hello_sent:
            self._send(host, AGENT_HELLO, body)
            host.hello_sent = True
            return
        # As worker_agent/heartbeat.py: a heartbeat is an entry of the host's heartbeats stream.
        envelope = seal(host.key, host.name, AGENT_HEARTBEAT, body)
        pipe.xadd(broker.stream(host.name, broker.HEARTBEATS), stream_entry(AGENT_HEARTBEAT, envelope),
                  maxlen=STREAM_MAXLEN[broker.HEARTBEATS], approximate=True)  # fmt: skip

    def emit_metrics(self, now: float) -> None:
        """One metric batch per running task per second, pipelined like the agent's outbox."""
        pipe = self.redis.pipeline(transaction=False)
        count = 0
        for host in self.hosts.values():
            reports: list[tuple[str, Any]] = []
            for task in host.running.values():
                task.step += 1
                point = {"kind": "metric", "ts": now, "mono": time.monotonic(), "step": task.step, "epoch": None,
                         "phase": "train", "metrics": {"loss": 1.0 / task.step, "examples_per_s": 1000.0}}  # fmt: skip
                reports.append((TASK_METRICS, flat(TaskMetricsBatch(task.task_id, task.attempt, [point]))))
            # As the agent's outbox: the host's reports of this second go as one sealed bundle (contracts/bundles.py).
            for entry in bundle_entries(reports, functools.partial(seal, host.key, host.name)):
                pipe.xadd(broker.stream(host.name, broker.METRICS), entry, maxlen=STREAM_MAXLEN[broker.METRICS],
                          approximate=True)  # fmt: skip
                count += 1
                if count % 500 == 0:
                    pipe.execute()
        try:
            pipe.execute()
            self.tally["metric_entries"] += count
        except redis.RedisError:
            self.tally["send_failures"] += 1

    # --- the loop -----------------------------------------------------------------------------------------------------
    def run(self) -> None:
        consumer = threading.Thread(target=self.consume, name="orders", daemon=True)
        consumer.start()
        stop_at = float(self.config.get("stop_at") or math.inf)
        next_metrics = time.time() + 1.0
        while not self.stopped.is_set() and time.time() < stop_at:
            now = time.time()
            # A real agent beats on a thread of its own: one host's orders never hold back another host's heartbeat.
            # Here one thread serves every host, so it takes orders for at most one heartbeat interval before it beats
            # (a pass's first wave, its launch orders sent in one pipeline, put 1,200 orders before this thread at
            # once, and draining them left 250 hosts silent past the heartbeat timeout; a quarter of a second per turn
            # left the orders too little of the thread on a busy machine: 46 went stale in the queue).
            turn_ends = now + self.interval_s
            while time.time() < turn_ends:
                try:
                    host_name, order = self.orders.get_nowait()
                except queue.Empty:
                    break
                self.handle_order(host_name, order, now)
            while self.ends and self.ends[0][0] <= now:
                _, host_name, key = heapq.heappop(self.ends)
                host = self.hosts[host_name]
                if key in host.running:
                    self._exit(host, key, 0)
            pipe = self.redis.pipeline(transaction=False)
            for host in self.hosts.values():
                if host.next_beat <= now:
                    self.beat(host, pipe)
                    host.next_beat += self.interval_s
                    if host.next_beat < now:  # fell behind (a stall): beat again at the next interval
                        host.next_beat = now + self.interval_s
            beats = len(pipe)
            try:
                pipe.execute()
                self.tally["heartbeats"] += beats
            except redis.RedisError:
                self.tally["send_failures"] += 1
            if now >= next_metrics:
                self.emit_metrics(now)
                next_metrics += 1.0
                if next_metrics < now:
                    next_metrics = now + 1.0
            self.stopped.wait(0.02)
        self.stopped.set()
        consumer.join(3)

    def results(self) -> dict[str, Any]:
        return {"tally": self.tally, "launches": self.launches, "exits": self.exits}


def _has_chief(env: dict[str, str]) -> bool:
    try:
        return "chief" in json.loads(env.get("TF_CONFIG") or "{}").get("cluster", {})
    except ValueError:
        return False


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    if config.get("cpu_idle"):
        # The fleet stands in for other machines: at Linux's idle priority it runs only on cores the control plane
        # leaves free (bench/scale.py --sim-idle).
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        # With autogroups on (kernel.sched_autogroup_enabled, the default on desktop and many cloud kernels), CPU is
        # shared between sessions first, and this process leads a session of its own (bench/stack.py): its group
        # still weighed as much as any other, whatever its threads' policy. The group's own nice is what lowers it.
        with contextlib.suppress(OSError):
            Path("/proc/self/autogroup").write_text("19")
    fleet = Fleet(config)
    signal.signal(signal.SIGTERM, lambda *_: fleet.stopped.set())
    signal.signal(signal.SIGINT, lambda *_: fleet.stopped.set())
    print(f"[fleet-sim] {len(fleet.hosts)} hosts beating every {fleet.interval_s:g} s", flush=True)
    fleet.run()
    Path(config["out"]).write_text(json.dumps(fleet.results()))
    print(f"[fleet-sim] stopped: {fleet.tally}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
