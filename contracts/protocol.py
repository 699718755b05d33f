"""The wire contract between agents and the orchestrator: queue and stream names, Celery task names, payload
dataclasses and the parsers that read untrusted payloads back (`parse_facts`, `parse_task_report`, `launch_spec_from`).
How messages are authenticated both ways is contracts/signing.py: every agent message is sealed (host, time, nonce,
name, body, HMAC under a key HKDF derives from the host's token; no token travels), every order to an agent is
signed with the control plane's Ed25519 key.

Part of `contracts`, which both the agent and the orchestrator import (neither imports the other). Payloads are plain
JSON-able dicts built from these dataclasses.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from contracts import broker
from contracts import environments as task_environments
from contracts.limits import MAX_HOST_CPUS, MAX_HOST_GPUS, MAX_HOST_MEMORY_MB
from contracts.signing import MAX_SIGNED_CHARS, WIRE_VERSION
from contracts.store import store_urls_from

# Re-exported for the agent's side; a task's side reads them in task_wire (stdlib only, the task's interpreter).
from contracts.task_wire import JOB_DIR_ENV, METRICS_FD_ENV, PROGRAM_CONFIG_ENV, TENSORBOARD_DIR_ENV  # noqa: F401

# 3: sealed agent messages (no token on the wire) and Ed25519-signed orders (contracts/signing.py). 4: task
# environments (LAUNCH_KEYS_SINCE). Agents of MIN_AGENT_PROTOCOL (one behind) are still accepted.
PROTOCOL_VERSION = WIRE_VERSION

ORCHESTRATOR_QUEUE = "orchestrator"  # the control plane's own Celery queue: no host may write it
# The control plane's scheduler passes (orchestrator/plumbing/pass_requests.py): consumed by a worker of its own as
# shipped (`-Q scheduler`, README "How it hangs together"), where a pass shares no process with the hosts' events; one
# worker may consume both queues instead (`-Q orchestrator,scheduler`).
SCHEDULER_QUEUE = "scheduler"
# Webhook deliveries (orchestrator/webhooks/outbox.py): a worker of their own (`-Q webhooks`), so that a receiver that
# answers slowly holds none of the threads that handle the hosts' events, the watchdog or scheduling. Never add it to
# the orchestrator's `-Q`: that undoes the point.
WEBHOOKS_QUEUE = "webhooks"

# agent -> orchestrator. An agent sends nothing on Celery: every message it sends is an entry of one of its own
# streams (contracts/broker.py: the only keys besides its order queue its broker user may write), fields {"name":
# <one of the names below>, "envelope": <the sealed message, JSON>} (`stream_entry`):
# - broker.EVENTS: AGENT_HELLO (once per agent start) and TASK_EVENT. Every orchestrator worker reads every host's
#   events stream (group EVENTS_GROUP) and hands the entries on to their Celery handlers on ORCHESTRATOR_QUEUE (task
#   events in batches), where each is applied at least once and exactly once (orchestrator/agents/relay.py).
# - broker.HEARTBEATS: AGENT_HEARTBEAT. Every orchestrator worker reads them in batches (group HEARTBEAT_GROUP, one
#   consumer per worker) and applies hundreds in a few statements (orchestrator/agents/heartbeats.py); as Celery
#   messages, one per host every few seconds, their handling cost more than a core at 500 hosts. A heartbeat says
#   something only while it is fresh, so its stream is capped short and an old entry is read and dropped as stale.
# - broker.METRICS: metric points, log lines, host samples and artifacts (see METRICS_GROUP below).
AGENT_HELLO = "orchestrator.agent_hello"
AGENT_HEARTBEAT = "orchestrator.agent_heartbeat"
HEARTBEAT_GROUP = "orchestrator"
EVENTS_GROUP = "orchestrator"

# orchestrator -> agent (consumed on agent_queue(host))
AGENT_PING = "agent.ping"


def agent_queue(host: str) -> str:
    """The Celery queue of `host`'s agent: under the host's key prefix (contracts/broker.py)."""
    return broker.order_queue(host)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_total_mb: int
    uuid: str = ""


@dataclass(frozen=True)
class EnvironmentFacts:
    """What an agent found when it probed one task environment (contracts/environments.py) on its host: `ok` when
    its interpreter ran and imported TensorFlow; `gpus_visible` the GPUs that TensorFlow lists; `gpu_reason` why it
    cannot use the GPUs NVML shows ("" when it can, or the host has none); `error` why the probe failed."""

    name: str
    interpreter: str
    ok: bool
    python: str = ""
    tensorflow: str = ""
    keras: str = ""
    gpus_visible: int = 0
    gpu_reason: str = ""
    error: str = ""


@dataclass(frozen=True)
class HostFacts:
    """What an agent knows about its machine; sent with hello and every heartbeat."""

    cpu_count: int
    memory_total_mb: int
    gpus: list[GpuInfo] = field(default_factory=list)
    tf_version: str = ""
    agent_version: str = ""
    hostname: str = ""
    pid: int = 0
    port_range: tuple[int, int] | None = None
    gpu_error: str = ""
    # The task environments the control plane told the agent of, as probed (an agent of protocol 3 sends none).
    environments: list[EnvironmentFacts] = field(default_factory=list)


@dataclass(frozen=True)
class RunningTask:
    job_id: int
    task_id: int
    attempt: int
    pid: int = 0


@dataclass(frozen=True)
class RecordedExit:
    """A task attempt the agent saw end and keeps (in its workdir) until the orchestrator acknowledges it with
    AGENT_ACK_EXITS. `lost`: the exit code is unknown (the agent restarted under it, or it never started), so the
    orchestrator treats it as a lost task rather than a failure of the program."""

    job_id: int
    task_id: int
    attempt: int
    seq: int
    pid: int = 0
    exit_code: int | None = None
    detail: str = ""
    lost: bool = False
    # How many output lines the task printed (seqs 0..lines-1), all sent before this exit; None: unknown (an agent
    # of an older version). The orchestrator applies the exit once that many are in (a final task has its whole log).
    lines: int | None = None

    def as_event(self) -> TaskEvent:
        """The EXITED event this exit is (the agent sends it at once; a report repeats it until acknowledged)."""
        return TaskEvent(
            task_id=self.task_id,
            attempt=self.attempt,
            kind=TaskEventKind.EXITED,
            pid=self.pid or None,
            exit_code=self.exit_code,
            detail=self.detail,
            seq=self.seq,
            lines=self.lines,
        )


@dataclass(frozen=True)
class TaskReport:
    """The agent's truth, sent with the hello and every heartbeat, from which the orchestrator converges
    (orchestrator/agents/reconcile.py): the task processes it runs now, the exits it recorded and has not had
    acknowledged, and `events_upto`, the sequence number of the last task event it had emitted when it wrote the
    report (both taken under one lock), so the orchestrator can tell a report that predates what it knows of a task
    from one that says the task is gone."""

    running: list[RunningTask] = field(default_factory=list)
    exits: list[RecordedExit] = field(default_factory=list)
    events_upto: int = 0


# A report lists at most this many exits (the oldest first); the rest follow once those are acknowledged.
MAX_REPORTED_EXITS = 500
MAX_REPORTED_RUNNING = 4096


@dataclass(frozen=True)
class HostReport:
    """The body of a hello and of every heartbeat (sealed like every agent message: contracts/signing.py)."""

    facts: HostFacts
    tasks: TaskReport | None = None

    def to_body(self) -> dict[str, Any]:
        return asdict(self)


def parse_facts(raw: dict[str, Any]) -> HostFacts:
    """Rebuild facts from a payload, rejecting anything malformed or out of bounds with ValueError (never trust the
    wire: a host claiming 2**31 CPUs would otherwise attract every task of its cluster)."""
    try:
        raw_gpus = raw.get("gpus", [])
        if len(raw_gpus) > MAX_HOST_GPUS:
            raise ValueError(f"{len(raw_gpus)} GPUs reported; at most {MAX_HOST_GPUS}")
        gpus = [
            GpuInfo(
                index=_bounded(g["index"], 0, MAX_HOST_GPUS * 16),
                name=str(g["name"])[:200],
                memory_total_mb=_bounded(g["memory_total_mb"], 0, MAX_HOST_MEMORY_MB),
                uuid=str(g.get("uuid", ""))[:100],
            )
            for g in raw_gpus
        ]
        port_range = raw.get("port_range")
        return HostFacts(
            cpu_count=_bounded(raw["cpu_count"], 1, MAX_HOST_CPUS),
            memory_total_mb=_bounded(raw["memory_total_mb"], 0, MAX_HOST_MEMORY_MB),
            gpus=gpus,
            tf_version=str(raw.get("tf_version", ""))[:50],
            agent_version=str(raw.get("agent_version", ""))[:50],
            hostname=str(raw.get("hostname", ""))[:255],
            pid=_bounded(raw.get("pid", 0), 0, 2**31),
            port_range=(_bounded(port_range[0], 0, 65535), _bounded(port_range[1], 0, 65535)) if port_range else None,
            gpu_error=str(raw.get("gpu_error", ""))[:500],
            environments=parse_environment_facts(raw.get("environments", [])),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"malformed host facts: {exc!r}") from exc


def parse_environment_facts(raw: Any) -> list[EnvironmentFacts]:
    """A report's environments, bounded (ValueError when malformed): at most MAX_ENVIRONMENTS, each name by the
    rule, each text cut to what a page shows."""
    if not isinstance(raw, list) or len(raw) > task_environments.MAX_ENVIRONMENTS:
        raise ValueError(f"at most {task_environments.MAX_ENVIRONMENTS} environments in a report")
    found = []
    for item in raw:
        if not isinstance(item, dict):
            raise ValueError("an environment's facts are an object")
        problem = task_environments.name_problem(item.get("name"))
        if problem:
            raise ValueError(problem)
        if not isinstance(item.get("ok"), bool):
            raise ValueError("an environment's ok is true or false")
        found.append(
            EnvironmentFacts(
                name=item["name"],
                interpreter=str(item.get("interpreter", ""))[: task_environments.MAX_INTERPRETER_CHARS],
                ok=item["ok"],
                python=str(item.get("python", ""))[:50],
                tensorflow=str(item.get("tensorflow", ""))[:50],
                keras=str(item.get("keras", ""))[:50],
                gpus_visible=_bounded(item.get("gpus_visible", 0), 0, MAX_HOST_GPUS),
                gpu_reason=str(item.get("gpu_reason", ""))[:1000],
                error=str(item.get("error", ""))[:1000],
            )
        )
    return found


def _bounded(value: Any, low: int, high: int) -> int:
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"{number} is outside {low}..{high}")
    return number


def parse_task_report(raw: Any) -> TaskReport | None:
    """A report's task section, None when the agent sent none; ValueError when it is malformed or too long."""
    if raw is None:
        return None
    try:
        running_raw, exits_raw = raw.get("running", []), raw.get("exits", [])
        if len(running_raw) > MAX_REPORTED_RUNNING or len(exits_raw) > MAX_REPORTED_EXITS:
            raise ValueError("too many tasks in one report")
        running = [
            RunningTask(
                job_id=_count(r["job_id"]),
                task_id=_count(r["task_id"]),
                attempt=_count(r["attempt"]),
                pid=_count(r.get("pid", 0)),
            )
            for r in running_raw
        ]
        exits = [
            RecordedExit(
                job_id=_count(r["job_id"]),
                task_id=_count(r["task_id"]),
                attempt=_count(r["attempt"]),
                seq=_count(r["seq"]),
                pid=_count(r.get("pid", 0)),
                exit_code=_exit_code(r.get("exit_code")),
                detail=str(r.get("detail", ""))[:500],
                lost=bool(r.get("lost", False)),
                lines=None if r.get("lines") is None else _count(r["lines"]),
            )
            for r in exits_raw
        ]
        events_upto = _count(raw.get("events_upto", 0))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed task report: {exc!r}") from exc
    return TaskReport(running=running, exits=exits, events_upto=events_upto)


def _exit_code(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not -255 <= value <= 255:
        raise ValueError(f"{value!r} is not an exit code")
    return value


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value


# --- running TF tasks -------------------------------------------------------------------------------------------
# orchestrator -> agent (on agent_queue(host)); the payload is an order signed by the control plane
# (contracts/signing.py) whose kind is the task name and whose body is a LaunchSpec / KillOrder.
AGENT_LAUNCH = "agent.launch"
AGENT_KILL = "agent.kill"
# The exits the orchestrator has stored (body: {"exits": [[task_id, attempt], ...]}): the agent may forget them.
AGENT_ACK_EXITS = "agent.ack_exits"

# agent -> orchestrator: a sealed envelope (contracts/signing.py) around a TaskEvent (an entry of the host's EVENTS
# stream) or a TaskLogBatch (an entry of its METRICS stream, like the metric traffic below).
TASK_EVENT = "orchestrator.task_event"
TASK_LOGS = "orchestrator.task_logs"


class TaskEventKind:
    STARTED = "started"  # the process exists (pid)
    LISTENING = "listening"  # its TF gRPC server accepts connections on its port
    EXITED = "exited"  # the process ended (exit_code; negative = killed by that signal)
    PORT_CONFLICT = "port_conflict"  # the port could not be bound before launch; nothing was started
    LAUNCH_FAILED = "launch_failed"  # refused or could not start (bad spec, bad script hash, exec error)


@dataclass(frozen=True)
class ProgramSpec:
    """What a task runs: an uploaded script (content travels with the message, addressed by SHA-256) or a
    built-in program of the runtime."""

    kind: str  # "script" | "builtin"
    args: list[str] = field(default_factory=list)
    script_sha256: str = ""
    script_b64: str = ""
    builtin: str = ""
    builtin_config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchSpec:
    job_id: int
    task_id: int
    attempt: int
    task_type: str
    task_index: int
    port: int | None  # None for a single-process (mirrored) task: nothing listens
    devices: list[int]
    gpu: bool  # True: devices are GPU indices (CUDA_VISIBLE_DEVICES); False: logical CPU device count
    env: dict[str, str]  # TF_CONFIG, GRPC_FAIL_FAST, TF_USE_LEGACY_KERAS, ...
    program: ProgramSpec
    kill_grace_s: float = 3.0
    # Where the job keeps checkpoints and artifacts on this host (the cluster's shared folder when it has one);
    # empty: the agent picks a folder under its own work directory.
    job_dir: str = ""
    # The job's own variables (Job.env), apart from `env` so the agent can check them against contracts/job_env.py
    # before it starts anything; `env` and the agent's own variables are set after them and win.
    user_env: dict[str, str] = field(default_factory=dict)
    # When the cluster has an object store: the task's presigned URLs (contracts/store.py StoreUrls, as a dict).
    store: dict[str, Any] = field(default_factory=dict)
    # The job's place in its cluster's pool of task uids (orchestrator/scheduler/task_uids.py): an agent with
    # `--task-uids A-B` runs it as uid A + uid_slot, the same on every host; None (an older control plane): the agent
    # picks (worker_agent/supervision/uid_pool.py).
    uid_slot: int | None = None
    # The job's task environment (contracts/environments.py): its name and its interpreter's absolute path on the
    # hosts; "" both: the agent's own interpreter (an older control plane, or a cluster with none registered).
    environment: str = ""
    interpreter: str = ""
    # The job's requirements file (contracts/environments.py requirements_problems): the agent runs the task in a
    # venv built from it on top of the environment, once per content (worker_agent/environments/venvs.py).
    requirements: str = ""


@dataclass(frozen=True)
class KillOrder:
    job_id: int
    task_id: int
    attempt: int
    reason: str = ""


@dataclass(frozen=True)
class TaskEvent:
    task_id: int
    attempt: int
    kind: str
    pid: int | None = None
    exit_code: int | None = None
    detail: str = ""
    at: float = field(default_factory=time.time)
    # The agent's event clock (worker_agent/supervision/ledger.py): grows with every event of the agent, across its
    # restarts. The orchestrator applies an event only when it is newer than the last one it applied to the task, so a
    # redelivered event changes nothing. 0: not numbered (always applied, state checks permitting).
    seq: int = 0
    # EXITED: the task's output line count (RecordedExit.lines).
    lines: int | None = None


@dataclass(frozen=True)
class TaskLogBatch:
    task_id: int
    attempt: int
    # (seq, stream, text): seq counts lines per task attempt from 0, so a redelivered batch is stored once.
    lines: list[tuple[int, str, str]]
    # Lines of this attempt the agent dropped for its output rate so far (contracts/publish_limits.py), a running
    # total like `shed`; a "lines dropped: N" line stands where they went.
    dropped: int = 0


# --- metrics: TF process -> agent -> orchestrator ------------------------------------------------------------------
# What a TF process writes to its metrics pipe, and the variables naming the pipe and its folders:
# contracts/task_wire.py (it runs inside the task's own interpreter, so it stands apart from this module's imports).
# The agent adds the task's identity and forwards what one read of the pipe returned as one batch (TASK_METRICS) at
# once; nothing waits longer than METRICS_FLUSH_S in the agent (the host sampler batches only below that interval).
METRICS_FLUSH_S = 0.2
TASK_METRICS = "orchestrator.task_metrics"
TASK_ARTIFACT = "orchestrator.task_artifact"


# Metric traffic (TASK_METRICS, HOST_SAMPLES, TASK_ARTIFACT) and log lines (TASK_LOGS) are entries of the host's
# METRICS stream, most of them bundled per host (contracts/bundles.py). The ingest (group METRICS_GROUP) reads the
# hosts' streams in INGEST partitions, each host's stream read by one of them (`ingest_partition`), hundreds of
# entries per round trip; it stores them in one transaction, then acknowledges and deletes them; an entry read but not
# acknowledged (a crash) is read again, and storing is idempotent. A flood of points never delays job lifecycle events.
# A stream holds only unprocessed entries.
METRICS_GROUP = "ingest"

# The browser's resume cursor: every stored metric point carries POINT_SEQ, its number within its job, 1, 2, ... in
# the order the transactions that stored them commit (the job's counter row stays locked until the commit, so two
# partitions storing one job's points take turns). A reconnecting page asks for "every point of job J numbered above
# N" and gets exactly what it missed, however the hosts are spread over partitions, and across a change of their
# number. A redelivered point keeps its number, so a page drops it as seen.
POINT_SEQ = "seq"


def ingest_partition(host: str, partitions: int) -> int:
    """Which of `partitions` ingest partitions reads `host`'s METRICS stream: a stable hash of its name (the same in
    every process, unlike Python's hash())."""
    return zlib.crc32(host.encode("utf-8")) % max(1, partitions)


# Each host's streams are capped at about this many entries (oldest dropped first), so a long-stopped reader cannot
# fill Redis: a day of one host's events, 50 minutes of heartbeats, hours of a busy host's metric traffic.
STREAM_MAXLEN = {broker.EVENTS: 100_000, broker.HEARTBEATS: 1_000, broker.METRICS: 200_000}  # see SHED_BACKLOG
# What a stream entry may weigh (its fields' bytes) before anyone parses it: a bigger one is dead-lettered unread
# (orchestrator/plumbing/streams.py). An artifact carries a file in base64, so its kind may weigh what the largest
# signed message may (contracts/signing.py); everything else is small.
MAX_ENTRY_BYTES = 1024 * 1024
MAX_ARTIFACT_ENTRY_BYTES = MAX_SIGNED_CHARS + 64 * 1024


def stream_entry(name: str, envelope: Any) -> dict[str, str]:
    """The fields of a stream entry (any host stream, contracts/broker.py) carrying the sealed message `envelope`."""
    return {"name": name, "envelope": json.dumps(envelope, separators=(",", ":"))}


def read_stream_entry(fields: dict[bytes, bytes]) -> tuple[str, Any]:
    """(name, envelope) of a stream entry; raises when it is not one (KeyError: a field missing; ValueError: not UTF-8
    or not JSON; RecursionError: nested too deep)."""
    return fields[b"name"].decode(), json.loads(fields[b"envelope"])


HOST_SAMPLES = "orchestrator.host_samples"


@dataclass(frozen=True)
class HostSampleBatch:
    """Host samples (kind of CPU/memory/GPU readings, one dict per sample):
    {"ts": wall seconds, "cpu_percent": float, "memory_used_mb": int, "memory_total_mb": int, "gpu_error": str,
     "gpus": [{"index": int, "name": str, "utilization_percent": float, "memory_used_mb": int,
               "memory_total_mb": int, "temperature_c": float | None, "power_w": float | None,
               "processes": [{"pid": int, "used_memory_mb": int | None}]}]}"""

    samples: list[dict[str, Any]]


@dataclass(frozen=True)
class TaskMetricsBatch:
    task_id: int
    attempt: int
    events: list[dict[str, Any]]  # the process's JSON objects, as written (kinds "metric" and "facts")
    # Step-level points the agent left out of this task attempt's reports so far (SHED_BACKLOG): a running total, so
    # a report lost, late or delivered twice still leaves the right count (the ingest keeps the highest).
    shed: int = 0
    # What the agent dropped of this task attempt's output for its bounds (contracts/publish_limits.py), running
    # totals: "artifacts", "artifact_bytes", "metric_lines".
    dropped: dict[str, int] | None = None


# Backpressure: while its metrics stream holds this many entries the ingest has not stored yet, an agent sends only
# every SHED_STRIDE-th step of a task's "metric" events (every epoch end and every facts object still go), counting
# the points it left out (TaskMetricsBatch.shed). A hundredth of STREAM_MAXLEN: a stopped ingest makes agents thin
# their traffic long before Redis would trim unread entries, and a merely slow one never does (at full fleet rate
# one ingest partition that fell behind was about 11 entries per host behind: README Sizing).
SHED_BACKLOG = 2_000
SHED_STRIDE = 10


def shed_step_points(events: list[Any]) -> tuple[list[Any], int]:
    """The events an agent still sends while its stream is backed up, and how many points it left out (one per
    metric value of a dropped event). Kept: anything that is not a step-level "metric" event (facts, epoch ends),
    and metric events on every SHED_STRIDE-th step."""
    kept: list[Any] = []
    shed = 0
    for event in events:
        step = event.get("step") if isinstance(event, dict) else None
        if (
            isinstance(event, dict)
            and event.get("kind") == "metric"
            and event.get("phase") != "epoch_end"
            and type(step) is int
            and step % SHED_STRIDE != 0
        ):
            metrics = event.get("metrics")
            shed += len(metrics) if isinstance(metrics, dict) else 1
            continue
        kept.append(event)
    return kept, shed


@dataclass(frozen=True)
class TaskArtifact:
    task_id: int
    attempt: int
    name: str
    sha256: str
    content_b64: str
    # In the object store instead (content_b64 empty): uploaded to artifact slot `slot` of the task attempt
    # (contracts/store.py artifact_key), `size` bytes. -1: the content travels inline.
    size: int = 0
    slot: int = -1


def exit_acks_from(body: dict[str, Any]) -> list[tuple[int, int]]:
    """The (task_id, attempt) pairs of an AGENT_ACK_EXITS body; ValueError when it is malformed."""
    try:
        pairs = body["exits"]
        if len(pairs) > MAX_REPORTED_EXITS:
            raise ValueError("too many exits in one acknowledgement")
        return [(_count(task_id), _count(attempt)) for task_id, attempt in pairs]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed exit acknowledgement: {exc!r}") from exc


def kill_order_from(body: dict[str, Any]) -> KillOrder:
    try:
        return KillOrder(**body)
    except TypeError as exc:
        raise ValueError(f"malformed kill order: {exc!r}") from exc


# Launch-spec keys an agent of an older protocol does not know, by the protocol that brought them: an agent refuses a
# spec with a key it does not know, so a launch order to a host one protocol behind leaves them out
# (`launch_body_for`). The one list of them: a key added to LaunchSpec for protocol N goes here under N.
LAUNCH_KEYS_SINCE: dict[int, tuple[str, ...]] = {4: ("environment", "interpreter", "requirements")}


def launch_body_for(body: dict[str, Any], protocol: int) -> dict[str, Any]:
    """A launch order's body as an agent speaking `protocol` reads it: without the keys of later protocols. Their
    values must be what such an agent does anyway (an empty `interpreter`: its own), which placement sees to by not
    putting a job that needs more on its host."""
    newer = {key for since, keys in LAUNCH_KEYS_SINCE.items() if since > protocol for key in keys}
    return {key: value for key, value in body.items() if key not in newer}


def launch_spec_from(body: dict[str, Any]) -> LaunchSpec:
    try:
        program = ProgramSpec(**body["program"])
        spec = LaunchSpec(**{**body, "program": program})
        if spec.uid_slot is not None:
            _count(spec.uid_slot)
        if spec.environment and (problem := task_environments.name_problem(spec.environment)):
            raise ValueError(problem)
        if spec.interpreter and (problem := task_environments.interpreter_problem(spec.interpreter)):
            raise ValueError(problem)
        if spec.requirements and (problems := task_environments.requirements_problems(spec.requirements)):
            raise ValueError("; ".join(problems))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed launch spec: {exc!r}") from exc
    store_urls_from(spec.store)  # ValueError when malformed
    return spec
