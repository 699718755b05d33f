"""Issue 12's acceptance for the wire, with real Redis, a real orchestrator, a real agent and real task processes.

A watcher records every Redis command (MONITOR) across a job's whole life and finds no token, no key derived from
it and no digest of it, however the command encodes it (Celery bodies are base64). Then, as anyone who can reach
the broker: every order the agent was sent, pushed back onto its queue after the job ended, runs nothing (the job's
marker file keeps its one line); orders forged with anything found on the broker or in the database are refused; a
validly signed but old order is refused; an order replayed after the agent restarted (same workdir) is refused as
seen before; captured heartbeats and task events pushed back onto the orchestrator's queue are refused and counted.
A freshly signed order does run (the control: the probes can tell a refusal from a program that never ran).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psutil
import pytest
import redis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contracts import broker
from contracts.protocol import AGENT_HEARTBEAT, AGENT_LAUNCH, ORCHESTRATOR_QUEUE, TASK_EVENT, agent_queue
from contracts.signing import agent_mac_key, sign_order
from contracts.task_messages import LaunchSpec, ProgramSpec
from orchestrator.identity import auth
from orchestrator.identity.keys import control_private_key
from orchestrator.models import Host, HostStatus, JobState
from orchestrator.plumbing import counters
from tests import factories
from tests.orchestrator.test_convergence import final, placed_now
from tests.support.processes import ManagedProcess, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

HOST = "watch-0"


# --- the watcher -----------------------------------------------------------------------------------------------------
class BrokerWatcher:
    """Every command the Redis server runs on the test's database, as MONITOR reports it, arguments unescaped."""

    _LINE = re.compile(rb"^\+[\d.]+ \[(\d+) [^\]]*\] (.*)$")
    _ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"')

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        self.db = int((parsed.path or "/0").lstrip("/") or 0)
        self.sock = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379))
        if parsed.password:
            user = f"{parsed.username} " if parsed.username else ""
            self.sock.sendall(f"AUTH {user}{parsed.password}\r\n".encode())
        self.sock.sendall(b"MONITOR\r\n")
        self.reader = self.sock.makefile("rb")
        self.commands: list[list[bytes]] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.reader:
            match = self._LINE.match(line.rstrip(b"\r\n"))
            if match and int(match[1]) == self.db:
                args = [_unescape(arg) for arg in self._ARG.findall(match[2])]
                with self.lock:
                    self.commands.append(args)

    def snapshot(self) -> list[list[bytes]]:
        with self.lock:
            return list(self.commands)

    def pushes(self, key: str) -> list[bytes]:
        """What was LPUSHed onto the list `key` (a Celery queue), oldest first."""
        return [c[2] for c in self.snapshot() if len(c) >= 3 and c[0].upper() == b"LPUSH" and c[1] == key.encode()]

    def stream_entries(self, stream: str) -> list[dict[bytes, bytes]]:
        """The fields of every entry XADDed to the stream `stream`, oldest first."""
        entries = []
        for c in self.snapshot():
            if len(c) >= 4 and c[0].upper() == b"XADD" and c[1] == stream.encode():
                fields = c[c.index(b"*") + 1 :]
                entries.append(dict(zip(fields[::2], fields[1::2], strict=True)))
        return entries

    def stop(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)


_ESCAPES = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("a"): 7, ord("b"): 8}


def _unescape(raw: bytes) -> bytes:
    """Redis's quoted representation (sdscatrepr) back to the bytes it shows."""
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i] == 0x5C and i + 1 < len(raw):
            follower = raw[i + 1]
            if follower == ord("x") and i + 3 < len(raw):
                out.append(int(raw[i + 2 : i + 4], 16))
                i += 4
                continue
            out.append(_ESCAPES.get(follower, follower))
            i += 2
            continue
        out.append(raw[i])
        i += 1
    return bytes(out)


def readings(value: bytes) -> Iterator[bytes]:
    """The bytes themselves and every string inside them once JSON and base64 are undone (Celery messages carry their
    body base64-encoded; envelopes carry their content as a JSON text)."""
    yield value
    try:
        parsed = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return
    for text in _strings(parsed):
        if text[:1] in ("{", "["):  # a JSON text inside (a sealed envelope, a signed order)
            yield from readings(text.encode())
            continue
        yield text.encode()
        if len(text) >= 16:
            try:
                decoded = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                continue
            yield from readings(decoded)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def macs(commands: list[list[bytes]]) -> set[str]:
    """Every MAC an agent's envelope carried, as seen on the broker."""
    found = set()
    for command in commands:
        for arg in command:
            for text in readings(arg):
                found.update(re.findall(rb'"mac":\s*"([0-9a-f]{64})"', text))
    return {m.decode() for m in found}


@pytest.fixture
def watcher(redis_url: str) -> Iterator[BrokerWatcher]:
    watching = BrokerWatcher(redis_url)
    yield watching
    watching.stop()


# --- what runs -----------------------------------------------------------------------------------------------------
def marker_script(path: Path) -> bytes:
    """A program whose every run appends one line to `path`: the count of lines is the count of runs."""
    return f"with open({str(path)!r}, 'a') as out:\n    out.write('ran\\n')\n".encode()


def runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def launch_body(marker: Path, task_id: int) -> dict[str, Any]:
    """A launch of a task nobody placed, which appends to `marker` if any agent ever runs it."""
    content = marker_script(marker)
    program = ProgramSpec(
        kind="script",
        script_b64=base64.b64encode(content).decode(),
        script_sha256=hashlib.sha256(content).hexdigest(),
    )
    spec = LaunchSpec(job_id=1, task_id=task_id, attempt=1, task_type="worker", task_index=0, port=None, devices=[0],
                      gpu=False, env={}, program=program, kill_grace_s=1.0)  # fmt: skip
    return asdict(spec)


def refusals(agent: ManagedProcess) -> int:
    return agent.output().count("refused agent.")


def push(client: redis.Redis, queue: str, payloads: list[bytes]) -> None:
    for payload in payloads:
        client.lpush(queue, payload)


def queue_order(order: dict[str, Any], kind: str = AGENT_LAUNCH) -> None:
    """Queue an order on the agent's queue, as anyone who can reach the broker can."""
    from config.celery import app

    with app.connection_for_write() as conn:
        app.send_task(kind, args=[order], queue=agent_queue(HOST), connection=conn)


@pytest.fixture
def lived(watcher, orchestrator, start_agent, alice, open_tmp):  # type: ignore[no-untyped-def]
    """A host's agent runs one job to its end under the watcher: (host, token, agent, marker file)."""
    host, token = factories.host(HOST, port_min=27500)
    Host.objects.filter(pk=host.pk).update(port_max=27509, cpu_slots=2)
    agent = start_agent(host.name, token)
    wait_until(lambda: Host.objects.get(pk=host.pk).status == HostStatus.ONLINE, timeout=30, what="the host online")
    markers = open_tmp / "markers"  # task uids can enter open_tmp, not pytest's tmp_path
    markers.mkdir(mode=0o777)
    markers.chmod(0o777)  # whatever user the task runs as writes here
    marker = markers / "job"

    job = final(placed_now(alice, host, marker_script(marker), strategy="mirrored", workers=1, devices_per_worker=1))

    assert job.state == JobState.SUCCEEDED, job.reason
    assert runs(marker) == 1
    # Until the exit is acknowledged, and a few heartbeats past it.
    wait_until(lambda: len(watcher.pushes(agent_queue(HOST))) >= 2, 30, what="the launch and the acknowledgement")
    heartbeats = broker.stream(HOST, broker.HEARTBEATS)
    beats = len(watcher.stream_entries(heartbeats))
    wait_until(lambda: len(watcher.stream_entries(heartbeats)) >= beats + 3, 30, what="three more heartbeats")
    return host, token, agent, marker


# --- the tests -----------------------------------------------------------------------------------------------------
def test_no_secret_crosses_the_broker_and_nothing_captured_or_forged_runs(
    lived, watcher, redis_url, start_agent, tmp_path
):  # type: ignore[no-untyped-def]
    host, token, agent, marker = lived
    client = redis.Redis.from_url(redis_url)
    markers = marker.parent

    # Nothing on the command line or in the environment the kernel shows for the agent.
    process = psutil.Process(agent.pid)
    assert token not in " ".join(process.cmdline())
    assert token.encode() not in Path(f"/proc/{agent.pid}/environ").read_bytes()

    # Every order the agent was sent (its launch, the acknowledgements), pushed back after the job ended.
    captured = watcher.pushes(agent_queue(HOST))
    assert len(captured) >= 2
    # The watcher reads through every layer: Celery's base64 body, the signed order, the script's own base64.
    # The launch among them (the first order a host gets now is its cluster's task environments).
    assert any(str(marker).encode() in text for order in captured for text in readings(order))
    before = refusals(agent)
    push(client, agent_queue(HOST), captured)
    wait_until(lambda: refusals(agent) >= before + len(captured), 30, what="every replayed order refused")
    assert runs(marker) == 1

    # Orders forged with what the database and the broker hold: the host's stored key (encrypted), its slices, every
    # MAC seen; as Ed25519 signing keys, and as protocol 2's HMAC keys.
    stored = Host.objects.get(pk=host.pk).agent_key
    raw = base64.b64decode(stored)
    material = {raw[i : i + 32] for i in range(0, len(raw) - 31, 4)} | {
        bytes.fromhex(m) for m in macs(watcher.snapshot())
    }
    forged_marker = markers / "forged"
    forged: list[dict[str, Any]] = []
    for number, candidate in enumerate(sorted(material)[:12]):
        body = launch_body(forged_marker, 900_000 + number)
        forged.append(sign_order(Ed25519PrivateKey.from_private_bytes(candidate), HOST, AGENT_LAUNCH, body))
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        for key in (candidate.hex(), stored):
            forged.append({"body": text, "mac": hmac.new(key.encode(), text.encode(), hashlib.sha256).hexdigest()})
    before = refusals(agent)
    for order in forged:
        queue_order(order)
    wait_until(lambda: refusals(agent) >= before + len(forged), 60, what="every forged order refused")
    assert not forged_marker.exists()

    # Validly signed, but issued an hour ago: refused as stale.
    stale_marker = markers / "stale"
    before = refusals(agent)
    queue_order(sign_order(control_private_key(), HOST, AGENT_LAUNCH, launch_body(stale_marker, 910_000),
                                   now=time.time() - 3600))  # fmt: skip
    wait_until(lambda: refusals(agent) > before, 30, what="the stale order refused")
    assert "refused agent.launch: stale:" in agent.output()
    assert not stale_marker.exists()

    # The control: a fresh order signed by the control plane does run: the agent starts its process. (The control
    # plane then kills it as a stray, a task nobody placed; under load that can come before its first line writes the
    # marker, so the agent's own word is the proof, and the marker at most once.)
    fresh_marker = markers / "fresh"
    queue_order(sign_order(control_private_key(), HOST, AGENT_LAUNCH, launch_body(fresh_marker, 920_000)))
    agent.wait_for_line(r"task 920000 attempt 1 started: pid \d+", timeout=30)
    fresh_push = wait_until(
        lambda: next((p for p in watcher.pushes(agent_queue(HOST)) if b"920000" in b"".join(readings(p))), None),
        10,
        what="the fresh order seen on the broker",
    )

    # The agent restarts on the same workdir; the same order, still fresh, pushed again: refused as seen before.
    assert agent.terminate(timeout=20) == 0
    agent.stop()
    restarted = start_agent(host.name, token)
    restarted.wait_for_line(r"consuming tfdash:host:watch-0:orders", timeout=30)
    push(client, agent_queue(HOST), [fresh_push])
    wait_until(lambda: "was seen before" in restarted.output(), 30, what="the replay after the restart refused")
    assert "task 920000 attempt 1 started" not in restarted.output()
    assert runs(fresh_marker) <= 1 and runs(marker) == 1

    # Across all of it, no secret on the broker, in any encoding the commands carry.
    key = agent_mac_key(token, host.name)
    needles = {
        "the token": token.encode(),
        "the HKDF key": key,
        "the HKDF key (hex)": key.hex().encode(),
        "the HKDF key (base64)": base64.b64encode(key),
        "sha256(token)": hashlib.sha256(token.encode()).hexdigest().encode(),
    }
    commands = watcher.snapshot()
    assert any(c[0].upper() == b"XADD" for c in commands)  # the metric stream was watched too
    found = {
        what
        for command in commands
        for arg in command
        for text in readings(arg)
        for what, needle in needles.items()
        if needle in text
    }
    assert found == set(), f"{found} seen on the broker"


def test_captured_agent_messages_replayed_are_refused_and_counted(lived, watcher, redis_url, orchestrator):
    _host, _token, _agent, _marker = lived
    client = redis.Redis.from_url(redis_url)
    heartbeats, events = (broker.stream(HOST, kind) for kind in (broker.HEARTBEATS, broker.EVENTS))
    beat = next(e for e in watcher.stream_entries(heartbeats) if e[b"name"] == AGENT_HEARTBEAT.encode())
    event_entry = next(e for e in watcher.stream_entries(events) if e[b"name"] == TASK_EVENT.encode())
    # Applied where it landed (orchestrator/agents/intake.py): no task event ever travels on the orchestrator's queue.
    assert not [p for p in watcher.pushes(ORCHESTRATOR_QUEUE) if TASK_EVENT.encode() in b"".join(readings(p))]
    replayed_before = counters.get(auth.REPLAYED)

    client.xadd(heartbeats, beat)  # a heartbeat is a stream entry, refused as seen (nonce) like a message
    client.xadd(events, event_entry)  # a task event, back on the host's stream: refused as seen

    wait_until(lambda: counters.get(auth.REPLAYED) >= replayed_before + 2, 30, what="the two replays refused")
    assert orchestrator.output().count("seen before") >= 2
