"""The wire between agents and the orchestrator, by name: the protocol version, the Celery queues, the host streams
and their consumer groups, the name of every message and order, and how a stream entry carries a sealed message
(`stream_entry`, `read_stream_entry`) and what it may weigh. How messages are authenticated both ways is
contracts/signing.py: every agent message is sealed (host, time, nonce, name, body, HMAC under a key HKDF derives
from the host's token; no token travels), every order to an agent is signed with the control plane's Ed25519 key.

What the messages hold: host_reports.py (hello and heartbeat), task_messages.py (orders to run and stop tasks, task
events and log lines), metric_messages.py (metrics, host samples, artifacts); task_wire.py what a task process writes.

Part of `contracts`, which both the agent and the orchestrator import (neither imports the other). Payloads are plain
JSON-able dicts built from those modules' dataclasses.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from contracts import broker
from contracts.signing import MAX_SIGNED_CHARS, WIRE_VERSION

# 3: sealed agent messages (no token on the wire) and Ed25519-signed orders (contracts/signing.py). 4: task
# environments (task_messages.LAUNCH_KEYS_SINCE). Agents of MIN_AGENT_PROTOCOL (one behind) are still accepted.
PROTOCOL_VERSION = WIRE_VERSION

ORCHESTRATOR_QUEUE = "orchestrator"  # the control plane's own Celery queue: no host may write it
# The control plane's scheduler passes (orchestrator/plumbing/pass_requests.py): consumed by a worker of its own as
# shipped (`-Q scheduler`, docs/how-it-works.md), where a pass shares no process with the hosts' events; one
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
#   events stream (group EVENTS_GROUP) and applies the entries itself, in the order read (task events in batches), each
#   at least once and exactly once (orchestrator/agents/intake.py); none travels on ORCHESTRATOR_QUEUE.
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
# fill Redis: a day of one host's events, 50 minutes of heartbeats, hours of a busy host's metric traffic (see
# metric_messages.SHED_BACKLOG).
STREAM_MAXLEN = {broker.EVENTS: 100_000, broker.HEARTBEATS: 1_000, broker.METRICS: 200_000}
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
