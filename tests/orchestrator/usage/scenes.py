"""Usage scenes the usage tests share (the API's, the page's, the CLI's and Prometheus'): jobs placed by the real
scheduler on online hosts (GPU or CPU), their tasks started and ended through the lifecycle as agents' events are
applied, and the device-seconds the tasks' own rows say they held."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from contracts.task_messages import TaskEventKind
from orchestrator.models import Host, Job, JobState, Task
from orchestrator.scheduler import scheduling
from tests import factories
from tests.orchestrator.jobs.test_restarts import apply

GPU = {"name": "Simulated H100", "memory_total_mb": 81_559}


def online_host(cluster: str, *, gpus: int = 0, cpu_slots: int = 4) -> Host:
    host, _token = factories.host(cluster_name=cluster)
    host.status, host.cpu_slots = "online", cpu_slots
    host.gpus = [{"index": i, "uuid": f"GPU-{host.name}-{i}", **GPU} for i in range(gpus)]
    host.save()
    return host


def placed(owner: Any, cluster: str, *, workers: int = 1, devices: int = 1, ps: int = 0, strategy: str = "") -> Job:
    """A job of `owner`'s, placed by a scheduler pass on `cluster` (its hosts online already)."""
    strategy = strategy or ("parameter_server" if ps else "multi_worker_mirrored")
    job = Job.objects.create(
        owner=owner, cluster=factories.cluster(cluster), name=f"{owner.username}-{cluster}", strategy=strategy,
        program_kind="builtin", builtin="digits_mlp", workers=workers, ps=ps, devices_per_worker=devices,
    )  # fmt: skip
    scheduling.schedule_cluster(job.cluster_id)
    job.refresh_from_db()
    assert job.state == JobState.STARTING, job.reason
    return job


def run(job: Job, *, placed_hours_ago: float) -> None:
    """Its tasks placed that long ago (the time the rows say, moved back: a test does not wait hours) and running."""
    Task.objects.filter(job=job).update(placed_at=timezone.now() - timedelta(hours=placed_hours_ago))
    for task in job.current_tasks():
        apply(task, TaskEventKind.STARTED, pid=1000 + task.pk)
        apply(task, TaskEventKind.LISTENING)


def end(job: Job) -> None:
    """Every task of it exits 0, as its agent reports (the one that speaks for the job first)."""
    for task in sorted(job.current_tasks(), key=lambda t: (t.type != "chief", t.index)):
        apply(Task.objects.get(pk=task.pk), TaskEventKind.EXITED, exit_code=0)


def held(by: str = "user", owners: set[str] | None = None) -> dict[str, float]:
    """Device-seconds per account from the tasks' own rows: devices x (finished_at - placed_at), ended tasks (of these
    owners only, when given)."""
    totals: dict[str, float] = defaultdict(float)
    tasks = Task.objects.filter(finished_at__isnull=False).select_related("job__owner", "job__cluster")
    if owners is not None:
        tasks = tasks.filter(job__owner__username__in=owners)
    for task in tasks:
        seconds = len(task.devices) * (task.finished_at - task.placed_at).total_seconds()
        if by == "user":
            accounts = [task.job.owner.username]
        elif by == "cluster":
            accounts = [task.job.cluster.name]
        else:
            accounts = list(task.job.owner.groups.values_list("name", flat=True))
        for account in accounts:
            totals[account] += seconds
    return {account: seconds for account, seconds in totals.items() if seconds}


def people() -> dict[str, Any]:
    """alice and bob in group vision, carol in nlp, dave in none, and sam, staff."""
    users = get_user_model().objects
    made = {name: users.create_user(name, password=f"pw-{name}-123") for name in ("alice", "bob", "carol", "dave")}
    made["sam"] = users.create_user("sam", password="pw-sam-123", is_staff=True)
    vision, nlp = Group.objects.create(name="vision"), Group.objects.create(name="nlp")
    made["alice"].groups.add(vision)
    made["bob"].groups.add(vision)
    made["carol"].groups.add(nlp)
    return made


def mixed_run(who: dict[str, Any]) -> list[Job]:
    """Jobs of four users on two clusters (GPU hosts on `gpu-lab`, CPU hosts on `cpu-lab`), of 1-4 tasks holding 1-2
    devices, a ParameterServer job among them (its chief and ps hold none), placed 1 to 30 hours ago (across UTC
    midnights), all ended."""
    for _ in range(2):
        online_host("gpu-lab", gpus=4)
        online_host("cpu-lab", cpu_slots=8)
    shapes = [
        (who["alice"], "gpu-lab", {"workers": 2, "devices": 2}, 3.0),
        (who["bob"], "gpu-lab", {"workers": 1, "devices": 1}, 30.25),
        (who["carol"], "cpu-lab", {"workers": 2, "devices": 1, "ps": 1}, 9.5),
        (who["dave"], "cpu-lab", {"workers": 3, "devices": 2}, 1.0),
        (who["alice"], "cpu-lab", {"workers": 1, "devices": 1}, 26.0),
    ]
    jobs = []
    for owner, cluster, shape, hours in shapes:
        job = placed(owner, cluster, **shape)
        run(job, placed_hours_ago=hours)
        end(job)
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED, (job.state, job.reason)
        jobs.append(job)
    return jobs
