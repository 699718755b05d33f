"""`report(step, **metrics)`: metrics from a custom training loop to the dashboard.

    from worker_agent import report

    for step, batch in enumerate(dataset):
        loss = train_step(batch)
        if step % 50 == 0:
            report(step, loss=float(loss), examples_per_s=rate)

Each call writes one "metric" line (phase "train" unless told) to the agent's metrics pipe (env TFDASH_METRICS_FD).
Throttling is yours: a call costs a few tens of microseconds plus a pipe write, so report every N steps or every
~0.5 s, not every step of a fast loop (reading a tensor's value with float() also waits for the device). Values that
are not finite numbers are dropped. Outside the product (no TFDASH_METRICS_FD) it does nothing and says so once on
stderr, so the same script runs anywhere. It never raises on a bad value or a closed pipe.

`model.fit` needs none of this: the product's injected hook reports it already.
"""

from __future__ import annotations

import sys

from contracts.task_wire import METRICS_FD_ENV
from worker_agent.runtime.emitter import PHASES, get_emitter

_warned = False


def report(step: int, *, epoch: int | None = None, phase: str = "train", **metrics: float) -> None:
    """Send `metrics` for global step `step`; `epoch` (counted from 1) and `phase` ("train" | "epoch_end") optional."""
    global _warned
    emitter = get_emitter()
    if not emitter.enabled:
        if not _warned:
            _warned = True
            print(f"tfdash: report() does nothing here: {METRICS_FD_ENV} is not set", file=sys.stderr, flush=True)
        return
    try:
        emitter.metric(int(step), metrics, epoch=epoch, phase=phase if phase in PHASES else "train")
    except Exception as exc:  # int(step) on garbage, ...: a report must never end the user's training
        print(f"tfdash: report() dropped a line: {exc!r}", file=sys.stderr, flush=True)


__all__ = ["report"]
