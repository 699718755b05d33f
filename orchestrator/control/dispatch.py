"""Orders to agents: one signed Celery message per task on the host's own queue, carrying ids and a small spec."""

from __future__ import annotations

import base64
import logging
from dataclasses import asdict

from config.celery import app
from contracts.protocol import AGENT_KILL, AGENT_LAUNCH, KillOrder, LaunchSpec, ProgramSpec, agent_queue, sign
from orchestrator.models import Job, ProgramKind, Task

log = logging.getLogger(__name__)

KILL_GRACE_S = 3.0  # TF ignores SIGTERM; the grace is for user scripts that clean up


def program_spec(job: Job) -> ProgramSpec:
    if job.program_kind == ProgramKind.SCRIPT:
        assert job.script is not None
        return ProgramSpec(
            kind="script",
            args=list(job.args),
            script_sha256=job.script.sha256,
            script_b64=base64.b64encode(bytes(job.script.content)).decode("ascii"),
        )
    return ProgramSpec(kind="builtin", args=list(job.args), builtin=job.builtin, builtin_config=job.builtin_config)


def launch_spec(task: Task, env: dict[str, str]) -> LaunchSpec:
    assert task.host is not None
    return LaunchSpec(
        job_id=task.job_id,
        task_id=task.pk,
        attempt=task.attempt,
        task_type=task.type,
        task_index=task.index,
        port=task.port,
        devices=list(task.devices),
        gpu=bool(task.host.gpus),
        env=env,
        program=program_spec(task.job),
        kill_grace_s=KILL_GRACE_S,
        job_dir=job_dir(task.job),
    )


def job_dir(job: Job) -> str:
    """The job's folder on every host when the cluster has a shared one; else the agent picks a local folder."""
    shared = job.cluster.shared_dir.rstrip("/")
    return f"{shared}/jobs/{job.pk}" if shared else ""


def launch_tasks(env_by_task: dict[int, dict[str, str]]) -> None:
    tasks = Task.objects.filter(pk__in=env_by_task).select_related("host", "job", "job__script", "job__cluster")
    for task in tasks:
        spec = launch_spec(task, env_by_task[task.pk])
        app.send_task(AGENT_LAUNCH, args=[sign(asdict(spec), task.host.token_hash)], queue=agent_queue(task.host.name))


def kill_tasks(tasks: list[Task], reason: str) -> None:
    for task in tasks:
        if task.host is None:
            continue
        order = KillOrder(job_id=task.job_id, task_id=task.pk, attempt=task.attempt, reason=reason)
        app.send_task(AGENT_KILL, args=[sign(asdict(order), task.host.token_hash)], queue=agent_queue(task.host.name))
