"""The cyclic garbage collector held off while latency matters: a scheduler pass allocates tens of thousands of
containers (the queue's rows, the fleet's states, the plan), nearly all freed by reference counting as the pass ends,
and the collections those allocations set off walked the pass's live objects again and again (bench/pass_cost.py: 15
young and 1-2 middle collections a steady pass, a tenth of its CPU). Paused, the collector runs once the pass has
committed and sent its launch orders, over what is left then.

The collector is the process's, not a thread's: pauses on several threads are counted, and it runs again when the
last one ends (the orchestrator's worker may take passes on several threads, `-Q orchestrator,scheduler`).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_pauses = 0
_was_enabled = False


@contextmanager
def paused() -> Iterator[None]:
    global _pauses, _was_enabled
    with _lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()


def freeze_startup_heap(sender: object = None, **kwargs: object) -> None:
    """Leave what start-up made (Django, the models, every module: some 160,000 objects) out of the garbage
    collector's full collections (`gc.freeze`, as CPython's documentation advises for long-lived servers): a pass
    or an event batch that allocates a few thousand tuples set off collections that walked all of them, which was
    half the time of a scheduler pass's fleet read (bench/pass_cost.py). The collector still runs on what is made
    after this. A receiver of Celery's `worker_ready` (config/celery.py) and called by the metrics ingest."""
    gc.freeze()
