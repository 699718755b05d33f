"""The slow worker: which worker of a running (or ended) job falls behind the others, and what its host shows.

Computed at read time from stored metric points and host samples (the job page and `GET /api/jobs/<id>/`, key
`insights.slow_worker`); a few bounded queries, nothing stored.

ParameterServer (asynchronous: each worker takes the next step as soon as it is free, so a slow worker completes
fewer). The chief reports every worker's completed steps per second per 2 s window (`worker_steps_per_s/<index>`,
worker_agent/runtime/worker_pace.py). Over the last WINDOWS (10) windows (20 s of training), a worker is slow when its
steps/s is below SLOW_SHARE (50 %) of the median of the other workers' steps/s in at least MIN_SLOW_WINDOWS (7) of
them. Why these figures (measured with tests/orchestrator/test_slow_worker_e2e.py: 2 workers, 1 ps and a chief on one
shared, loaded 2-core machine, four runs; docs/user-guide/metrics.md, "The slow worker"): running free, the slower
worker's pace was at least 0.67 of the other's in every window but a run's first (0.35-0.88: the workers start one
after the other); pinned to one CPU beside `stress-ng --cpu 1` it was 0.11-0.47 of the other's in 38 windows of 40,
0.64 in one, and 1.03 in one that began before the pinning. Half the others' pace sits between the two with a margin
on each side; 7 of 10 forgives a worker a few odd windows (start-up, a GC pause, a checkpoint) and names a steady
laggard within 20 s.

MultiWorkerMirrored (synchronous: every worker steps together, so steps/s is the same for all and a slow worker slows
everyone). Each worker reports `step_time_s` and `input_wait_fraction` per window (the input-bound measurement); its
input wait per step is their product. Over each worker's last WINDOWS windows (medians), the worker whose input wait
per step exceeds the median of the others' by more than MWMS_EXCESS (10 %) of the step time is named: the others wait
for it in every collective. 10 %: TF's profiler calls 5 % of the step moderately and 20 % highly input-bound; a
difference of 10 % between workers is as large as the whole of a moderately input-bound step, material whatever the
cause. A worker's own compute time cannot be told from its wait in the collectives with these two series, so a worker
slow in compute alone is not named (the input-bound insight and the host notes are what there is).

Host notes, for a named worker, over the span of the windows judged (its host's samples and this job's tasks' own
`process_cpu_percent`, which every task process reports while it computes):
- "CPU busy with other processes" when the host's CPU is at least HOST_BUSY_PERCENT (75 %) busy (median) and what
  this job's own tasks on that host use (the sum of their medians) leaves at least OTHERS_PERCENT (25 points) of the
  host's capacity to other processes;
- "GPU shared" when a GPU of the host that runs one of this job's processes also lists another process.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from contracts.strategies import Strategy, TaskType
from orchestrator.models import HostSample, Job, MetricPoint, Task

WINDOWS = 10
MIN_SLOW_WINDOWS = 7
SLOW_SHARE = 0.5
MWMS_EXCESS = 0.10
HOST_BUSY_PERCENT = 75.0
OTHERS_PERCENT = 25.0

PACE_METRIC = "worker_steps_per_s/"  # worker_agent/runtime/worker_pace.py (the agent's side cannot be imported here)
CPU_METRIC = "process_cpu_percent"
INPUT_WAIT_METRIC = "input_wait_fraction"
STEP_TIME_METRIC = "step_time_s"

PS_RULE = (
    f"a worker is slow when its steps/s stay below {SLOW_SHARE:.0%} of the median of the other workers' in at "
    f"least {MIN_SLOW_WINDOWS} of the last {WINDOWS} 2-second windows"
)
MWMS_RULE = (
    f"the worker whose input wait per step exceeds the others' by more than {MWMS_EXCESS:.0%} of the step time over "
    f"its last {WINDOWS} windows is named"
)


@dataclass(frozen=True)
class Lagging:
    """A worker the rule names: `share` is its pace / the others' (ParameterServer) or its excess input wait / the
    step time (MultiWorkerMirrored); `mine` and `others` the medians compared."""

    index: int
    windows: int  # the windows in which it was behind
    considered: int  # the windows judged
    share: float
    mine: float
    others: float


# --- the rules, on plain numbers ----------------------------------------------------------------------------------
def lagging_parameter_server(windows: Sequence[Mapping[int, float]]) -> list[Lagging]:
    """Slow workers among `windows` (oldest first; each worker index -> its steps/s in that window), slowest first."""
    recent = list(windows)[-WINDOWS:]
    found = []
    for index in sorted({i for window in recent for i in window}):
        ratios, mine, theirs, behind = [], [], [], 0
        for window in recent:
            if index not in window or len(window) < 2:
                continue
            others = median(value for other, value in window.items() if other != index)
            if others <= 0:
                continue
            ratios.append(window[index] / others)
            mine.append(window[index])
            theirs.append(others)
            behind += window[index] < SLOW_SHARE * others
        if behind >= MIN_SLOW_WINDOWS:
            found.append(Lagging(index, behind, len(ratios), median(ratios), median(mine), median(theirs)))
    return sorted(found, key=lambda lag: lag.share)


def lagging_multi_worker(series: Mapping[int, Sequence[tuple[float, float]]]) -> list[Lagging]:
    """The worker (a list of at most one) whose input wait per step exceeds the others' by more than MWMS_EXCESS of
    the step time; `series`: worker index -> its (input_wait_fraction, step_time_s) pairs, oldest first."""
    recent = {i: list(pairs)[-WINDOWS:] for i, pairs in series.items() if len(pairs) >= MIN_SLOW_WINDOWS}
    if len(recent) < 2:
        return []
    waits = {i: median(fraction * step for fraction, step in pairs) for i, pairs in recent.items()}
    step_time = median(step for pairs in recent.values() for _fraction, step in pairs)
    if step_time <= 0:
        return []
    found = []
    for index, wait in waits.items():
        others = median(w for i, w in waits.items() if i != index)
        excess = (wait - others) / step_time
        if excess > MWMS_EXCESS:
            found.append(Lagging(index, len(recent[index]), len(recent[index]), excess, wait, others))
    return sorted(found, key=lambda lag: -lag.share)[:1]


def readiness(considered: int) -> str:
    return "too_early" if considered < MIN_SLOW_WINDOWS else "even"


# --- reading a job ------------------------------------------------------------------------------------------------
def judge(job: Job) -> dict[str, Any] | None:
    """The job's slow-worker insight (see the module's docstring), or None for a job it does not apply to (another
    strategy, one worker: there are no others to compare with)."""
    if job.workers < 2:
        return None
    tasks = list(Task.objects.filter(job_id=job.pk, attempt=job.attempt).select_related("host"))
    if job.strategy == Strategy.PARAMETER_SERVER:
        return _parameter_server(job, tasks)
    if job.strategy == Strategy.MULTI_WORKER_MIRRORED:
        return _multi_worker(job, tasks)
    return None


def _parameter_server(job: Job, tasks: list[Task]) -> dict[str, Any]:
    chief = next((t for t in tasks if t.type == TaskType.CHIEF), None)
    rows = []
    if chief is not None:
        # Every pace line names every worker of the job: worker 0's last WINDOWS steps are the windows, and each of
        # their (name, step) pairs is one probe of the points' unique index, however long the job ran.
        points = MetricPoint.objects.filter(task_id=chief.pk, phase="train")
        last = points.filter(name=f"{PACE_METRIC}0").order_by("-step").values_list("step", flat=True)[:WINDOWS]
        names = [f"{PACE_METRIC}{index}" for index in range(job.workers)]
        rows = list(points.filter(name__in=names, step__in=list(last)).values_list("step", "name", "value", "ts"))
    by_step: dict[int, dict[int, float]] = defaultdict(dict)
    stamps: list[float] = []
    for step, name, value, ts in rows:
        suffix = name[len(PACE_METRIC) :]
        if suffix.isdigit():
            by_step[step][int(suffix)] = value
            stamps.append(ts)
    widest = max((len(window) for window in by_step.values()), default=0)
    windows = [by_step[step] for step in sorted(by_step) if len(by_step[step]) == widest]  # the cut-off oldest: out
    considered = sum(1 for window in windows if len(window) >= 2)
    lagging = lagging_parameter_server(windows)
    workers = {t.index: t for t in tasks if t.type == TaskType.WORKER}
    named = [
        _named(job, tasks, workers[lag.index], (min(stamps), max(stamps)), _ps_detail(lag))
        for lag in lagging
        if lag.index in workers
    ]
    state = "slow" if named else ("not_measured" if not rows else readiness(considered))
    return _result(Strategy.PARAMETER_SERVER, PS_RULE, state, considered, named)


def _multi_worker(job: Job, tasks: list[Task]) -> dict[str, Any]:
    workers = {t.index: t for t in tasks if t.type == TaskType.WORKER}
    series: dict[int, list[tuple[float, float]]] = {}
    stamps: list[float] = []
    for index, task in workers.items():
        points = MetricPoint.objects.filter(task_id=task.pk, phase="train")
        # Not every window carries an input wait (the runtime samples some steps only): its last WINDOWS that do.
        waits = list(
            points.filter(name=INPUT_WAIT_METRIC).order_by("-step").values_list("step", "value", "ts")[:WINDOWS]
        )
        at = [step for step, _v, _ts in waits]
        steps = dict(points.filter(name=STEP_TIME_METRIC, step__in=at).values_list("step", "value"))
        stamps += [ts for step, _v, ts in waits if step in steps]
        pairs = [(value, steps[step]) for step, value, _ts in reversed(waits) if step in steps]
        if pairs:
            series[index] = pairs
    lagging = lagging_multi_worker(series)
    named = [_named(job, tasks, workers[lag.index], (min(stamps), max(stamps)), _mwms_detail(lag)) for lag in lagging]
    considered = min((min(len(p), WINDOWS) for p in series.values()), default=0) if len(series) >= 2 else 0
    state = "slow" if named else ("not_measured" if not series else readiness(considered))
    return _result(Strategy.MULTI_WORKER_MIRRORED, MWMS_RULE, state, considered, named)


def _ps_detail(lag: Lagging) -> str:
    return (
        f"completes {lag.mine:.1f} steps/s against the others' {lag.others:.1f} ({lag.share:.0%} of their pace); "
        f"below {SLOW_SHARE:.0%} in {lag.windows} of the last {lag.considered} windows"
    )


def _mwms_detail(lag: Lagging) -> str:
    return (
        f"waits {lag.mine * 1000:.0f} ms per step for its input against the others' {lag.others * 1000:.0f} ms "
        f"({lag.share:.0%} of the step time more): the others wait for it in every step"
    )


def _named(job: Job, tasks: list[Task], task: Task, span: tuple[float, float], detail: str) -> dict[str, Any]:
    notes = host_notes(tasks, task, span) if task.host_id else []
    host = task.host.name if task.host_id else ""
    message = f"{task.label} {detail}" + (f". Its host: {'; '.join(notes)}" if notes else "")
    return {
        "task": task.label,
        "task_id": task.pk,
        "index": task.index,
        "host": host,
        "detail": detail,
        "host_notes": notes,
        "message": message,
    }


def _result(strategy: str, rule: str, state: str, considered: int, named: list[dict[str, Any]]) -> dict[str, Any]:
    if state == "slow":
        message = "; ".join(entry["message"] for entry in named)
    elif state == "even":
        message = f"No slow worker: none fell behind in the last {considered} windows."
    elif state == "too_early":
        message = f"Too early to tell: {considered} windows measured, {MIN_SLOW_WINDOWS} needed."
    else:
        message = "Not measured: no per-worker pace was reported for this job."
    return {
        "strategy": str(strategy),
        "state": state,
        "rule": rule,
        "windows": considered,
        "workers": named,
        "message": message,
        "at": time.time(),
    }


# --- what the named worker's host shows ---------------------------------------------------------------------------
def host_notes(tasks: Iterable[Task], task: Task, span: tuple[float, float]) -> list[str]:
    """What the samples of `task`'s host say over `span` (wall seconds): CPU busy with other processes, GPU shared."""
    start, end = span
    here = [t for t in tasks if t.host_id == task.host_id]
    samples = list(
        HostSample.objects.filter(host_id=task.host_id, ts__gte=start, ts__lte=end).values_list("cpu_percent", "gpus")
    )
    notes = []
    busy = [cpu for cpu, _gpus in samples if cpu is not None]
    if busy:
        shares = _cpu_shares(here, span)
        host_cpu, ours = median(busy), sum(shares.values())
        if host_cpu >= HOST_BUSY_PERCENT and host_cpu - ours >= OTHERS_PERCENT:
            own = shares.get(task.pk, 0.0)
            notes.append(
                f"CPU busy with other processes ({host_cpu:.0f}% of the host busy, this job's tasks there "
                f"{ours:.0f}%, {task} itself {own:.0f}%)"
            )
    notes += _gpu_notes([gpus for _cpu, gpus in samples], {t.pid for t in here if t.pid})
    return notes


def _cpu_shares(tasks: list[Task], span: tuple[float, float]) -> dict[int, float]:
    """Task id -> the median of its own CPU share over `span` (tasks that reported none: absent)."""
    values: dict[int, list[float]] = defaultdict(list)
    rows = MetricPoint.objects.filter(
        task_id__in=[t.pk for t in tasks], phase="train", name=CPU_METRIC, ts__gte=span[0] - 2.0, ts__lte=span[1]
    ).values_list("task_id", "value")
    for task_id, value in rows[: 4 * WINDOWS * max(len(tasks), 1)]:
        values[task_id].append(value)
    return {task_id: median(shares) for task_id, shares in values.items()}


def _gpu_notes(samples: Iterable[Any], pids: set[int]) -> list[str]:
    """A GPU that runs one of `pids` and lists another process too, with the most others seen at once."""
    others_seen: dict[int, int] = {}
    utilization: dict[int, list[float]] = defaultdict(list)
    for gpus in samples:
        for gpu in gpus if isinstance(gpus, list) else []:
            processes = gpu.get("processes") if isinstance(gpu, dict) else None
            if not isinstance(processes, list):
                continue
            listed = {p.get("pid") for p in processes if isinstance(p, dict)}
            if listed & pids and listed - pids:
                index = gpu.get("index")
                others_seen[index] = max(others_seen.get(index, 0), len(listed - pids))
                if isinstance(gpu.get("utilization_percent"), int | float):
                    utilization[index].append(gpu["utilization_percent"])
    notes = []
    for index, others in sorted(others_seen.items(), key=lambda item: str(item[0])):
        busy = f", {median(utilization[index]):.0f}% utilized" if utilization[index] else ""
        notes.append(f"GPU shared (GPU {index} also runs {others} other process{'es' if others > 1 else ''}{busy})")
    return notes
