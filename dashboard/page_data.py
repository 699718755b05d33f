"""What the job and cluster pages show beyond the rows themselves: each host's slots and latest load, a job's facts.

Plain reads, no side effects; the views stay thin and the host tables' htmx partial and the full page share them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import OuterRef, Subquery

from contracts import batching
from contracts.host_samples import readable_gpus
from contracts.programs import BUILTIN_PROGRAMS
from contracts.run_config import RunConfig, train_examples
from contracts.terminal_text import render_line
from dashboard import verdict
from orchestrator import limits
from orchestrator.metrics import drops, log_reader
from orchestrator.models import Cluster, Host, HostSample, HostStatus, Job, Task, TaskLogLine
from orchestrator.scheduler import fleet_state, protection, queue_view

# A sample older than this many heartbeat timeouts is not "live" load any more (the agent stopped sampling).
SAMPLE_FRESH_TIMEOUTS = 2.0


@dataclass(frozen=True)
class GpuLoad:
    index: int
    utilization: float | None
    memory_used_mb: float | None
    memory_total_mb: float | None


@dataclass(frozen=True)
class HostRow:
    host: Host
    slots: int
    slots_used: int
    # The latest sample, when the host is online and the sample fresh; None otherwise.
    cpu_percent: float | None = None
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    gpus: list[GpuLoad] = field(default_factory=list)
    sample_age_s: float | None = None

    @property
    def slots_free(self) -> int:
        return max(0, self.slots - self.slots_used)

    @property
    def memory_percent(self) -> float | None:
        if self.memory_used_mb is None or not self.memory_total_mb:
            return None
        return 100.0 * self.memory_used_mb / self.memory_total_mb


@dataclass(frozen=True)
class ClusterRows:
    cluster: Cluster
    hosts: list[HostRow]  # every host: the summary counts them all
    shown: list[HostRow] = field(default_factory=list)  # the page of them the table renders
    page: int = 1
    pages: int = 1
    first: int = 0  # 1-based numbers of the first and last host shown (0: none)
    last: int = 0

    @property
    def slots(self) -> int:
        return sum(h.slots for h in self.hosts)

    @property
    def slots_free(self) -> int:
        return sum(h.slots_free for h in self.hosts if h.host.status == HostStatus.ONLINE)

    @property
    def online(self) -> int:
        return sum(1 for h in self.hosts if h.host.status == HostStatus.ONLINE)


# Hosts rendered per cluster table: a page of 500 hosts with 8 GPUs each took most of a second to render, and the
# table is fetched again every 2 s while the page is open.
HOSTS_PER_PAGE = 100


def cluster_rows(now: float | None = None, page: int = 1) -> list[ClusterRows]:
    """Every cluster with its hosts: device slots used by active tasks (as the scheduler counts them) and the
    host's latest CPU/memory/GPU sample. Four queries however many hosts: clusters, hosts with their latest sample
    id (an index scan each), samples, active tasks."""
    now = time.time() if now is None else now
    latest = HostSample.objects.filter(host=OuterRef("pk")).order_by("-ts").values("pk")[:1]
    hosts = list(Host.objects.select_related("cluster").annotate(latest_sample=Subquery(latest)).order_by("name"))
    samples = HostSample.objects.in_bulk([h.latest_sample for h in hosts if h.latest_sample])  # type: ignore[attr-defined]
    states = {s.name: s for s in fleet_state.host_states(hosts)}
    fresh_s = SAMPLE_FRESH_TIMEOUTS * float(settings.TFDASH_HEARTBEAT_TIMEOUT_S)
    by_cluster: dict[int, list[HostRow]] = {}
    for host in hosts:
        state = states[host.name]
        row = {
            "host": host,
            "slots": len(state.device_ids),
            "slots_used": len(set(state.device_ids) & state.used_devices),
        }
        sample = samples.get(host.latest_sample)  # type: ignore[attr-defined]
        if sample is not None and host.status == HostStatus.ONLINE and now - sample.ts <= fresh_s:
            row.update(
                cpu_percent=sample.cpu_percent,
                memory_used_mb=sample.memory_used_mb,
                memory_total_mb=sample.memory_total_mb or host.memory_total_mb,
                gpus=[_gpu_load(g) for g in readable_gpus(sample.gpus)],
                sample_age_s=max(0.0, now - sample.ts),
            )
        by_cluster.setdefault(host.cluster_id, []).append(HostRow(**row))
    return [_paged(c, by_cluster.get(c.pk, []), page) for c in Cluster.objects.order_by("name")]


def _paged(cluster: Cluster, hosts: list[HostRow], page: int) -> ClusterRows:
    pages = max(1, -(-len(hosts) // HOSTS_PER_PAGE))
    page = min(max(page, 1), pages)
    start = (page - 1) * HOSTS_PER_PAGE
    shown = hosts[start : start + HOSTS_PER_PAGE]
    return ClusterRows(cluster, hosts, shown, page, pages, start + 1 if shown else 0, start + len(shown))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _gpu_load(gpu: dict[str, Any]) -> GpuLoad:
    """A GPU entry as readable_gpus leaves it (a stored sample may be older than the ingest's check)."""
    return GpuLoad(
        index=gpu["index"],
        utilization=_number(gpu["utilization_percent"]),
        memory_used_mb=_number(gpu["memory_used_mb"]),
        memory_total_mb=_number(gpu["memory_total_mb"]),
    )


def job_parts(job: Job) -> dict[str, Any]:
    """What the job page's live part shows (dashboard/_job_live.html): the page and the socket's `job` frames."""
    failed = job.failed_task
    tasks = latest_runs(job)
    run = run_facts(job)
    has_metrics = job.metric_points.exists()
    ran = any(t.started_at for t in tasks)
    ahead, head = queue_view.queue_place(job)
    return {
        # A waiting job's place: how many wait ahead of it, and why the first of them does not start.
        "queue_ahead": ahead,
        "queue_head": head,
        # A running job that could be a victim but is inside its class's minimum run, or past its bound.
        "protected": protection.protected(job),
        # What the state alone does not tell: preempted by whom and when, resumed where, timed out, held.
        "story": list(job.events.order_by("at", "id")[:100]),
        "tasks": tasks,
        "failure_tail": shown_lines(failed.log_tail()) if failed else [],
        # Why it failed, above the failed task's tail (dashboard/verdict.py): {} while it runs or when none was made.
        "verdict": verdict.shown(job),
        "artifacts": list(job.artifacts.order_by("name").values("name", "size")),
        # The hyperparameters' facts (batch sizes, learning rate) are in the asked-and-used table when there is one.
        "key_facts": job_facts(job, hyperparameters=not run),
        "run_facts": run,
        "has_metrics": has_metrics,
        # Said only once the job has run a while: a script that neither calls model.fit nor report() sends nothing.
        "reports_no_metrics": ran and not has_metrics and (job.is_terminal or job.state == "running"),
        "points_thinned_note": limits.points_thinned_note(job.points_stored, job.points_thinned)
        if job.points_thinned
        else "",
        "points_shed_note": limits.points_shed_note(shed) if (shed := job.points_shed()) else "",
        # What the agents dropped of its tasks' output for the per-task bounds (contracts/publish_limits.py).
        "output_dropped_note": drops.job_note(job),
    }


def shown_lines(lines: list[TaskLogLine]) -> list[TaskLogLine]:
    """Stored lines (not saved again) with their text as a terminal shows it (contracts/terminal_text.py)."""
    for line in lines:
        line.text = render_line(line.text)
    return lines


def latest_runs(job: Job) -> list[Task]:
    """The current placement's tasks, each slot once: a ParameterServer worker relaunched in place shows its newest
    run (whose `restarts` counts the relaunches), not the run that died."""
    latest: dict[tuple[str, int], Task] = {}
    for task in job.current_tasks():
        latest[(task.type, task.index)] = task  # ordered by restart: the last one wins
    return list(latest.values())


def task_names(job: Job) -> dict[int, str]:
    """What the charts call each task the job ever ran (metric points name tasks by id), earlier placements marked.

    "Earlier" is judged against the newest placement among the tasks read here, not `job.attempt` read a moment
    before: a job placed between the two reads (a page opened right after submitting) would mark its only placement.
    """
    tasks = list(job.tasks.values_list("pk", "type", "index", "attempt"))
    newest = max((attempt for *_, attempt in tasks), default=0)
    return {
        pk: f"{kind} {index}" + ("" if attempt == newest else f" (placement {attempt})")
        for pk, kind, index, attempt in tasks
    }


# The log tail: the last lines of each task, on the page and in the socket's `log` frames.
LOG_TAIL_LINES = 60


def log_tail(job: Job, tasks: list[Task] | None, chosen: int | None) -> dict[str, Any]:
    """The log panel: the current placement's tasks and the chosen one's (else the first's) last lines."""
    tasks = latest_runs(job) if tasks is None else tasks
    task = next((t for t in tasks if t.pk == chosen), None)
    if task is None and chosen is not None:  # an earlier placement's task, still worth reading
        task = job.tasks.filter(pk=chosen).select_related("host").first()
    task = task or (tasks[0] if tasks else None)
    lines = []
    if task is not None:
        rows = task.log_lines.order_by("-seq").values_list("seq", "stream", "text")[:LOG_TAIL_LINES]
        lines = log_reader.shown(list(reversed(rows)))  # each line as a terminal shows it (a bar at its last state)
    cursor = log_cursor(None, [seq for seq, _stream, _text in lines]) if lines else None
    return {"tail_tasks": tasks, "tail_task": task, "tail_lines": lines, "tail_cursor": cursor}


def log_cursor(after: int | None, seqs: list[int]) -> int:
    """A task's log cursor once a reader holds `seqs` (ascending, a non-empty read of the lines above `after`, at most
    LOG_TAIL_LINES of them): the highest seq below which nothing it will still be sent is missing.

    Lines of one task may commit out of order, so the cursor stops below a hole and the late line is sent when it
    comes. A read that filled the tail starts a new floor: lines below it are older than anything the tail shows and
    are never sent, so they must not hold the cursor back (else every later read would send the same tail again).
    """
    cursor = seqs[0] - 1 if after is None or len(seqs) >= LOG_TAIL_LINES else after
    for seq in seqs:
        if seq > cursor + 1:
            break
        cursor = max(cursor, seq)
    return cursor


def job_facts(job: Job, *, hyperparameters: bool = True) -> list[tuple[str, str]]:
    """The job's key facts in reading order: what was asked for, and what the chief (or worker 0) reported once it
    ran (replicas in sync, batch sizes, learning rate, checkpoints). A fact not reported yet is left out."""
    reported = job.facts or {}
    facts: list[tuple[str, str]] = []
    strategy = job.get_strategy_display()
    if reported.get("strategy") and reported["strategy"] != strategy:
        strategy += f" (TensorFlow: {reported['strategy']})"
    facts.append(("Strategy", strategy))
    shape = f"{job.workers} worker{'s' if job.workers != 1 else ''}"
    if job.ps:
        shape += f" + {job.ps} ps"
    facts.append(("Tasks", f"{shape} × {job.devices_per_worker} device{'s' if job.devices_per_worker != 1 else ''}"))
    program = f"built-in {job.builtin}" if job.builtin else (job.script.filename if job.script_id else "")
    if program:
        facts.append(("Program", program))
    if "replicas_in_sync" in reported:
        facts.append(("Replicas in sync", str(reported["replicas_in_sync"])))
    batches = [
        (label, reported[key])
        for key, label in (
            ("global_batch", "global"),
            ("per_replica_batch", "per replica"),
            ("machine_batch", "per machine"),
            ("per_device_batch", "per device"),
        )
        if reported.get(key) is not None
    ]
    if batches and hyperparameters:
        facts.append(("Batch size", " · ".join(f"{label} {_plain(value)}" for label, value in batches)))
    if reported.get("effective_learning_rate") is not None and hyperparameters:
        rate = _plain(reported["effective_learning_rate"])
        base = reported.get("base_learning_rate")
        if base is not None and reported.get("scale_lr"):
            rate += f" (base {_plain(base)}, scaling {reported['scale_lr']}"
            if reported.get("warmup_epochs"):
                rate += f", warm-up {_plain(reported['warmup_epochs'])} epochs"
            rate += ")"
        facts.append(("Effective learning rate", rate))
    if "checkpoint_dir" in reported:
        facts.append(("Checkpoints", reported["checkpoint_dir"] or "off"))
    elif job.cluster.shared_dir:
        facts.append(("Shared folder", job.cluster.shared_dir))
    facts.append(("Restarts", f"{job.restarts} of {job.max_restarts} allowed"))
    return facts


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


@dataclass(frozen=True)
class RunFact:
    key: str
    label: str
    asked: str  # what the person set (or the default that applied), or what it implies for the job's shape
    used: str  # what the runtime reported it used; "" until it has


def run_facts(job: Job) -> list[RunFact]:
    """The hyperparameters next to what the runtime used: the run's config (its defaults where left out) and what
    it implies for the job's shape (contracts/batching.py, as the form's calculator), against the chief's facts."""
    config = dict(job.builtin_config or {})
    reported = job.facts or {}
    defaults = RunConfig(program=job.builtin) if job.builtin in BUILTIN_PROGRAMS else None
    if not config and not reported:
        return []

    def asked(key: str) -> Any:
        if key in config:
            return config[key]
        return getattr(defaults, key, None)

    expected: batching.Calculation | None = None
    try:
        examples = (
            train_examples(RunConfig(program=job.builtin, examples=int(asked("examples") or 0))) if defaults else None
        )
        expected = batching.calculate(
            job.strategy,
            job.workers,
            job.devices_per_worker,
            int(asked("per_replica_batch")),
            float(asked("learning_rate")),
            str(asked("scale_lr")),
            float(asked("warmup_epochs") or 0),
            examples,
        )
    except (TypeError, ValueError):  # a script that was given no hyperparameters: nothing implied
        expected = None
    b = expected.batches if expected else None
    scale = asked("scale_lr")
    rate_asked = ""
    if asked("learning_rate") is not None:
        rate_asked = f"{_plain(asked('learning_rate'))}, scaling {scale or 'none'}"
        if expected is not None:
            rate_asked += f" → {_plain(expected.effective_learning_rate)}"
    warmup_used = ""
    if reported.get("warmup_epochs") is not None:
        warmup_used = _epochs(reported["warmup_epochs"])
        if reported.get("warmup_steps") is not None:
            warmup_used += f" = {reported['warmup_steps']} steps"
    rows = [
        RunFact("epochs", "Epochs", _shown(asked("epochs")), _shown(reported.get("epochs"))),
        RunFact(
            "per_replica_batch",
            "Per-replica batch",
            _shown(asked("per_replica_batch")),
            _shown(reported.get("per_replica_batch")),
        ),
        RunFact(
            "replicas_in_sync",
            "Replicas in sync",
            _shown(b and b.replicas_in_sync),
            _shown(reported.get("replicas_in_sync")),
        ),
        RunFact("global_batch", "Global batch", _shown(b and b.global_batch), _shown(reported.get("global_batch"))),
        RunFact(
            "machine_batch", "Per-machine batch", _shown(b and b.machine_batch), _shown(reported.get("machine_batch"))
        ),
        RunFact(
            "per_device_batch",
            "Per-device batch",
            _shown(b and b.per_device_batch),
            _shown(reported.get("per_device_batch")),
        ),
        RunFact(
            "steps_per_epoch",
            "Steps per epoch",
            _shown(expected and expected.steps_per_epoch),
            _shown(reported.get("steps_per_epoch")),
        ),
        RunFact("learning_rate", "Learning rate", rate_asked, _shown(reported.get("effective_learning_rate"))),
        RunFact(
            "warmup",
            "Warm-up",
            "" if asked("warmup_epochs") is None else f"{_plain(asked('warmup_epochs'))} epochs",
            warmup_used,
        ),
        RunFact("optimizer", "Optimizer", _shown(asked("optimizer")), _shown(reported.get("optimizer"))),
    ]
    return [row for row in rows if row.asked or row.used]


def _epochs(value: Any) -> str:
    return f"{_plain(value)} epoch{'' if value == 1 else 's'}"


def _shown(value: Any) -> str:
    return "" if value is None or value == "" else _plain(value)
