"""Running TF tasks on the wire: the orders the control plane sends an agent (`LaunchSpec` with its `ProgramSpec`,
`KillOrder`, the acknowledgement of stored exits), signed (contracts/signing.py), and what the agent sends back about
each task attempt (`TaskEvent` of a `TaskEventKind`, `TaskLogBatch`); with the parsers of untrusted order bodies and
the launch-spec keys of each protocol version (`LAUNCH_KEYS_SINCE`, `launch_body_for`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from contracts import environments as task_environments
from contracts.store import store_urls_from
from contracts.wire_values import count


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
            count(spec.uid_slot)
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
