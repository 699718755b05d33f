"""What an agent reports about its host and its tasks, on its hello and every heartbeat (`HostReport`): the machine's
facts (CPUs, memory, GPUs, the task environments it probed) and its task report (what runs, the exits not yet
acknowledged), with the parsers that read them back from an untrusted payload (`parse_facts`, `parse_task_report`)
and the orchestrator's acknowledgement of stored exits (`exit_acks_from`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from contracts import environments as task_environments
from contracts.limits import MAX_HOST_CPUS, MAX_HOST_GPUS, MAX_HOST_MEMORY_MB
from contracts.task_messages import TaskEvent, TaskEventKind
from contracts.wire_values import bounded, count, exit_code


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
                index=bounded(g["index"], 0, MAX_HOST_GPUS * 16),
                name=str(g["name"])[:200],
                memory_total_mb=bounded(g["memory_total_mb"], 0, MAX_HOST_MEMORY_MB),
                uuid=str(g.get("uuid", ""))[:100],
            )
            for g in raw_gpus
        ]
        port_range = raw.get("port_range")
        return HostFacts(
            cpu_count=bounded(raw["cpu_count"], 1, MAX_HOST_CPUS),
            memory_total_mb=bounded(raw["memory_total_mb"], 0, MAX_HOST_MEMORY_MB),
            gpus=gpus,
            tf_version=str(raw.get("tf_version", ""))[:50],
            agent_version=str(raw.get("agent_version", ""))[:50],
            hostname=str(raw.get("hostname", ""))[:255],
            pid=bounded(raw.get("pid", 0), 0, 2**31),
            port_range=(bounded(port_range[0], 0, 65535), bounded(port_range[1], 0, 65535)) if port_range else None,
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
                gpus_visible=bounded(item.get("gpus_visible", 0), 0, MAX_HOST_GPUS),
                gpu_reason=str(item.get("gpu_reason", ""))[:1000],
                error=str(item.get("error", ""))[:1000],
            )
        )
    return found


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
                job_id=count(r["job_id"]),
                task_id=count(r["task_id"]),
                attempt=count(r["attempt"]),
                pid=count(r.get("pid", 0)),
            )
            for r in running_raw
        ]
        exits = [
            RecordedExit(
                job_id=count(r["job_id"]),
                task_id=count(r["task_id"]),
                attempt=count(r["attempt"]),
                seq=count(r["seq"]),
                pid=count(r.get("pid", 0)),
                exit_code=exit_code(r.get("exit_code")),
                detail=str(r.get("detail", ""))[:500],
                lost=bool(r.get("lost", False)),
                lines=None if r.get("lines") is None else count(r["lines"]),
            )
            for r in exits_raw
        ]
        events_upto = count(raw.get("events_upto", 0))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed task report: {exc!r}") from exc
    return TaskReport(running=running, exits=exits, events_upto=events_upto)


def exit_acks_from(body: dict[str, Any]) -> list[tuple[int, int]]:
    """The (task_id, attempt) pairs of an AGENT_ACK_EXITS body; ValueError when it is malformed."""
    try:
        pairs = body["exits"]
        if len(pairs) > MAX_REPORTED_EXITS:
            raise ValueError("too many exits in one acknowledgement")
        return [(count(task_id), count(attempt)) for task_id, attempt in pairs]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed exit acknowledgement: {exc!r}") from exc
