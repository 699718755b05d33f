"""A job's progress and ETA, from what the task that speaks for it reported (plain Python; orchestrator/metrics/
progress.py reads the points and facts and keeps Job.progress, every surface shows `describe`'s words).

What it says (Job.progress, {} before anything is known):
  {"epoch": 3, "epochs": 10, "step": 90, "steps": 300 | None, "examples_per_s": 1234.5 | None, "eta_s": 42.0 | None,
   "resumed_from_epoch": 0, "at": unix time}
- epoch: the epoch in progress (counted from 1, as Keras prints it), or the last one finished when none is.
- step / steps: the run's global step and its total (epochs x steps per epoch), the total only when both are known.
- examples_per_s: the whole job's, from the speaking task's latest window: its steps/s x the global batch (a
  MultiWorkerMirrored worker's own examples_per_s is its share of each synchronous step); its own figure when the
  global batch is unknown.
- eta_s: from the run's own recent epochs: the median of the durations of its last ETA_EPOCHS finished epochs
  (epoch_time_s, validation included; the run's first epoch left out once another one ended: it traces the graphs)
  x the epochs left, less the part of the epoch in progress already done (its share of the steps when the steps per
  epoch are known, else its time so far, at most one epoch). Before this run's first epoch ends, with the steps per
  epoch known and a tenth of that epoch done: the steps left at the latest window's step rate. Unknown epochs, or
  nothing measured yet: None. 0 once the last epoch ended.
- at: when the newest figure behind it was measured (the TF process's clock): an ETA shown later is eta_s less the
  time since.
A resumed or restarted run counts from where it resumed: only epochs after `resumed_from_epoch` are this run's (an
earlier attempt's epochs never count as this run's speed; each attempt's tasks are rows of their own too).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ETA_EPOCHS = 3  # the recent epochs whose median duration is the ETA's pace
_MAX_COUNT = 2**62  # bounds for counts read from a TF process's facts (JSON: anything)


@dataclass(frozen=True)
class EpochEnd:
    """An epoch_end point of the speaking task: the epoch just finished (from 1), the global step at its end, its
    duration (epoch_time_s) and when it ended."""

    epoch: int
    step: int
    seconds: float
    ts: float


@dataclass(frozen=True)
class Window:
    """The speaking task's latest train window: the epoch in progress (from 1), the global step, when, its rates."""

    epoch: int
    step: int
    ts: float
    steps_per_s: float | None
    examples_per_s: float | None


@dataclass(frozen=True)
class RunFacts:
    """What the run says of itself (the speaking task's facts): epochs, steps per epoch, where it resumed."""

    epochs: int | None = None
    steps_per_epoch: int | None = None
    resumed_from_epoch: int = 0
    global_batch: int | None = None


def run_facts(facts: Mapping[str, Any] | None, epochs_asked: Any = None) -> RunFacts:
    """RunFacts from a task's facts (the builtin runtime's, or the injected callback's: Keras' own `epochs` and
    `steps`); `epochs_asked` (the job's configuration) when the facts do not say."""
    facts = facts if isinstance(facts, Mapping) else {}
    epochs = _count(facts.get("epochs"))
    return RunFacts(
        epochs=epochs if epochs is not None else _count(epochs_asked),
        steps_per_epoch=_count(facts.get("steps_per_epoch")),
        resumed_from_epoch=_count(facts.get("resumed_from_epoch"), zero=True) or 0,
        global_batch=_count(facts.get("global_batch")),
    )


def compute(run: RunFacts, ends: Sequence[EpochEnd], window: Window | None, now: float) -> dict[str, Any]:
    """The progress dict (see the module's docstring) of a run; {} when nothing is known yet."""
    resumed = run.resumed_from_epoch
    # In the order they happened (a second `fit` in one script counts its epochs from 1 again, its steps on).
    mine = sorted((e for e in ends if e.epoch > resumed), key=lambda e: e.step)
    last = mine[-1] if mine else None
    done = last.epoch if last is not None else resumed
    # An earlier attempt's window, or one of an epoch already finished, says nothing of the epoch in progress.
    current = (
        window if window is not None and window.epoch > resumed and (last is None or window.ts >= last.ts) else None
    )
    if last is None and current is None and resumed == 0:
        return {}
    in_progress = current if current is not None and current.epoch > done else None
    spe = run.steps_per_epoch
    step = max(current.step if current is not None else 0, last.step if last is not None else resumed * (spe or 0))
    times = [t.ts for t in (current, last) if t is not None]
    return {
        "epoch": in_progress.epoch if in_progress is not None else done,
        "epochs": run.epochs,
        "step": step,
        "steps": run.epochs * spe if run.epochs is not None and spe is not None else None,
        "examples_per_s": _rounded(_examples_per_s(current or window, run.global_batch)),
        "eta_s": _rounded(_eta(run, mine, in_progress)),
        "resumed_from_epoch": resumed,
        "at": max(times) if times else now,
    }


def _eta(run: RunFacts, mine: list[EpochEnd], window: Window | None) -> float | None:
    """Seconds left (see the module's docstring); `window` only when it is of the epoch in progress."""
    epochs, spe = run.epochs, run.steps_per_epoch
    done = mine[-1].epoch if mine else run.resumed_from_epoch
    if epochs is None:
        return None
    if done >= epochs:
        return 0.0
    # Measured (a builtin run, 8 epochs of ~1.3 s): the first epoch took ~5 s (tracing), and with it in the median the
    # ETA after epoch 2 was 22 s against 10 s.
    recent = mine[1:] if len(mine) > 1 else mine
    durations = [e.seconds for e in recent[-ETA_EPOCHS:] if e.seconds > 0]
    if durations:
        pace = statistics.median(durations)
        into = 0.0
        if window is not None:
            if spe:
                into = pace * min(1.0, max(0.0, (window.step - mine[-1].step) / spe))
            else:
                into = min(pace, max(0.0, window.ts - mine[-1].ts))
        return max(0.0, pace * (epochs - done) - into)
    # No epoch of this run finished yet: its step rate, once a tenth of the epoch is done (its first windows are slow:
    # measured, 145 examples/s at step 3 against 5,500 later, an ETA of 350 s for 15 s).
    if spe and window is not None and window.steps_per_s and window.step - done * spe >= max(1, spe // 10):
        return max(0, epochs * spe - window.step) / window.steps_per_s
    return None


def _examples_per_s(window: Window | None, global_batch: int | None) -> float | None:
    if window is None:
        return None
    if window.steps_per_s is not None and global_batch:
        return window.steps_per_s * global_batch
    return window.examples_per_s


def _rounded(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 1)


def _count(value: Any, zero: bool = False) -> int | None:
    """A positive whole number (or 0 with `zero`) from a fact; None otherwise (a bool, a float, a string, too big)."""
    if isinstance(value, bool) or not isinstance(value, int) or value >= _MAX_COUNT:
        return None
    return value if value > 0 or (zero and value == 0) else None


# --- words --------------------------------------------------------------------------------------------------------
def describe(progress: Mapping[str, Any] | None, *, now: float, running: bool, short: bool = False) -> str:
    """The progress in words: "epoch 3/10 · step 90/300 · 1,235 examples/s · ETA 2 min" (`short`: "epoch 3/10 · ETA
    2 min", the jobs list). The ETA only while the job runs, less the time since it was measured; "" when none."""
    if not progress or not isinstance(progress.get("epoch"), int):
        return ""
    epochs = progress.get("epochs")
    parts = [f"epoch {progress['epoch']}" + (f"/{epochs}" if isinstance(epochs, int) else "")]
    step, steps = progress.get("step"), progress.get("steps")
    if not short and isinstance(step, int) and isinstance(steps, int):
        parts.append(f"step {step:,}/{steps:,}")
    rate = progress.get("examples_per_s")
    if not short and isinstance(rate, int | float):
        parts.append(f"{rate:,.0f} examples/s")
    eta, at = progress.get("eta_s"), progress.get("at")
    if running and isinstance(eta, int | float) and isinstance(at, int | float):
        parts.append(f"ETA {eta_words(eta - max(0.0, now - at))}")
    return " · ".join(parts)


def eta_words(seconds: float) -> str:
    """'45 s', '2 min', '1 h 5 min': a person's rounding of a time left."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
