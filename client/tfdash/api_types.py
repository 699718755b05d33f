"""The shapes of what the tfdash REST API answers (jobs, tasks, log lines), as the client types them, and the job
states that end a job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

TERMINAL_STATES = ("succeeded", "failed", "cancelled", "timed_out")


class Job(TypedDict, total=False):
    id: int
    name: str
    owner: str
    cluster: int
    cluster_name: str
    strategy: str
    workers: int
    ps: int
    devices_per_worker: int
    env: dict[str, str]
    state: str
    reason: str
    attempt: int
    restarts: int
    failure: dict[str, Any] | None
    diagnosis: dict[str, Any]  # why it failed or timed out; {} when not (docs/user-guide/why.md)
    preflight: dict[str, Any]  # its preflight: state, job, reason (docs/user-guide/preflight.md); {} for none
    preflight_for: int | None  # on a preflight: the job it checks
    created_at: str
    started_at: str | None
    finished_at: str | None


class Task(TypedDict, total=False):
    id: int
    attempt: int
    type: str
    index: int
    host: str | None
    port: int | None
    state: str
    exit_code: int | None


class LogLine(TypedDict):
    task: str  # "worker:0"
    task_id: int
    seq: int
    stream: str  # stdout | stderr
    text: str


def task_label(task: Mapping[str, Any]) -> str:
    return f"{task.get('type')}:{task.get('index')}"
