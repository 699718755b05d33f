"""Is it input-bound? Per worker, from the share of each step it waited for its input pipeline.

Computed at read time from stored metric points and host samples (the job page and `GET /api/jobs/<id>/`, key
`insights.input`); one bounded query per task and one per host, nothing stored.

What is judged: each task's `input_wait_fraction` (the share of a train window's mean step time that sampled steps
spent in IteratorGetNext; worker_agent/runtime/input_wait.py) over its last WINDOWS (10) train windows, about 5 s of
training or 10 steps, whichever is longer. The share judged is their mean, as TensorFlow's profiler takes input time
over step time for the whole trace: a median looked steadier, but with steps of 0.5 s or more a window is one step,
and a pipeline that waits on every other step read 7 % by its median and 63 % by its mean (the profiler: 63 %,
bench/input_bound.py). The thresholds are the profiler's (its input-pipeline analysis): >= 20 % of the step time
"highly", >= 5 % "moderately", else not input-bound.

The fix fits what was seen: a worker that waits while its host's CPU is saturated (the median of the host's samples
over the windows judged >= CPU_SATURATED_PERCENT, 90 %) gets "cache / more CPUs" (more parallel calls would compete
for the same cores); otherwise "prefetch + parallel map" (and interleave for many files): the input steps run one at
a time, or after the step rather than beside it, and cores are left to run them.

Measured: `Model.fit` over a tf.data.Dataset (tf_keras and Keras 3), one process or MultiWorkerMirrored. Not
measured (state "not_measured"): ParameterServer (fit runs its steps as closures on the workers), fit with
steps_per_execution > 1, run_eagerly, custom training loops.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.models import Job, Task

HIGHLY = 0.20
MODERATELY = 0.05
WINDOWS = 10
MIN_WINDOWS = 3
CPU_SATURATED_PERCENT = 90.0

INPUT_WAIT_METRIC = "input_wait_fraction"  # worker_agent/runtime/metrics.py (the agent's side cannot be imported)
STEP_TIME_METRIC = "step_time_s"

NOT_MEASURED = (
    "Not measured: the input wait is measured for Model.fit over a tf.data.Dataset (one process or "
    "MultiWorkerMirrored); not for ParameterServer, steps_per_execution > 1, run_eagerly or custom training loops."
)
FIX_PARALLEL = (
    "Overlap the input with the step: end the pipeline with .prefetch(tf.data.AUTOTUNE) and give its map "
    "num_parallel_calls=tf.data.AUTOTUNE (reading many files: interleave(..., num_parallel_calls=tf.data.AUTOTUNE))."
)
FIX_CPU = (
    "The host's CPUs are saturated, so more parallel calls will not help: .cache() the data after its expensive "
    "steps (or decode it once, ahead of training), or run this worker on a host with more free CPUs."
)


@dataclass(frozen=True)
class Judgement:
    level: str  # "highly", "moderately", "not" (input-bound), or "too_early"
    share: float | None  # the mean wait share of the windows judged
    windows: int
    fix: str


def level(share: float) -> str:
    """TensorFlow's profiler's words for a step-time share spent waiting for input."""
    if share >= HIGHLY:
        return "highly"
    if share >= MODERATELY:
        return "moderately"
    return "not"


def judge_worker(shares: Sequence[float], host_cpu_percent: float | None = None) -> Judgement:
    """The judgement of one worker from its windows' input-wait shares (oldest first) and its host's median CPU."""
    recent = list(shares)[-WINDOWS:]
    share = sum(recent) / len(recent) if recent else None
    if share is None or len(recent) < MIN_WINDOWS:
        return Judgement("too_early", share, len(recent), "")
    found = level(share)
    if found == "not":
        fix = ""
    elif host_cpu_percent is not None and host_cpu_percent >= CPU_SATURATED_PERCENT:
        fix = FIX_CPU
    else:
        fix = FIX_PARALLEL
    return Judgement(found, share, len(recent), fix)


# --- reading a job ------------------------------------------------------------------------------------------------
def judge(job: Job) -> dict[str, Any]:
    """The job's input-bound insight: one entry per task that reported its input wait."""
    # Imported here, so the rule above imports no Django: bench/input_bound.py and the runtime test use it alone.
    from orchestrator.models import Task  # noqa: PLC0415

    tasks = list(Task.objects.filter(job_id=job.pk, attempt=job.attempt).select_related("host").order_by("id"))
    workers = [entry for entry in (_task_entry(task) for task in tasks) if entry is not None]
    judged = [w for w in workers if w["level"] != "too_early"]
    if not workers:
        state, message = "not_measured", NOT_MEASURED
    elif not judged:
        state, message = "too_early", f"Too early to tell: fewer than {MIN_WINDOWS} windows measured."
    else:
        state = "measured"
        bound = [w for w in judged if w["level"] != "not"]
        message = "; ".join(w["message"] for w in bound) if bound else "No worker waits for its input."
    return {
        "state": state,
        "thresholds": {"highly": HIGHLY, "moderately": MODERATELY},
        "workers": workers,
        "message": message,
        "at": time.time(),
    }


def _task_entry(task: Task) -> dict[str, Any] | None:
    from orchestrator.models import MetricPoint  # noqa: PLC0415 - see judge()

    rows = (
        MetricPoint.objects.filter(task_id=task.pk, phase="train", name__in=(INPUT_WAIT_METRIC, STEP_TIME_METRIC))
        .order_by("-step")
        .values_list("step", "name", "value", "ts")[: 4 * WINDOWS]
    )
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    stamps: list[float] = []
    for step, name, value, ts in rows:
        by_step[step][name] = value
        stamps.append(ts)
    windows = [values for _step, values in sorted(by_step.items()) if INPUT_WAIT_METRIC in values][-WINDOWS:]
    if not windows:
        return None
    host_cpu = _host_cpu(task, (min(stamps), max(stamps)))
    found = judge_worker([w[INPUT_WAIT_METRIC] for w in windows], host_cpu)
    step_times = [w[STEP_TIME_METRIC] for w in windows if STEP_TIME_METRIC in w]
    step_s = median(step_times) if step_times else None
    return {
        "task": task.label,
        "task_id": task.pk,
        "host": task.host.name if task.host_id else "",
        "level": found.level,
        "share": found.share,
        "windows": found.windows,
        "step_time_s": step_s,
        "host_cpu_percent": host_cpu,
        "fix": found.fix,
        "message": _message(task.label, found, step_s, host_cpu),
    }


def _host_cpu(task: Task, span: tuple[float, float]) -> float | None:
    from orchestrator.models import HostSample  # noqa: PLC0415 - see judge()

    if not task.host_id:
        return None
    busy = list(
        HostSample.objects.filter(
            host_id=task.host_id, ts__gte=span[0] - 2.0, ts__lte=span[1], cpu_percent__isnull=False
        )
        .order_by("-ts")
        .values_list("cpu_percent", flat=True)[: 4 * WINDOWS]
    )
    return median(busy) if busy else None


def _message(label: str, found: Judgement, step_s: float | None, host_cpu: float | None) -> str:
    if found.level == "too_early" or found.share is None:
        return f"{label}: too early to tell ({found.windows} windows measured)."
    wait = f" ({found.share * step_s * 1000:.0f} ms of a {step_s * 1000:.0f} ms step)" if step_s else ""
    words = {"highly": "highly input-bound", "moderately": "moderately input-bound", "not": "not input-bound"}
    cpu = f"; its host's CPU {host_cpu:.0f}% busy" if host_cpu is not None and found.level != "not" else ""
    return f"{label} is {words[found.level]}: waits {found.share:.0%} of each step for its input{wait}{cpu}."
