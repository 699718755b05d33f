"""The process side of the metrics pipe: JSON lines to the file descriptor named by env TFDASH_METRICS_FD.

The line kinds are the contract in contracts/protocol.py ("metric", "facts", "artifact"). No TensorFlow here: the
injected hook and `report()` use this module in processes that may never import it.

Writing must never hurt training: values that are not finite numbers are dropped (JSON has no NaN), a line that
cannot be serialised is dropped, and a broken pipe (the agent went away) disables the emitter for good. One lock
serialises writers, so a custom loop's `report()` and a Keras callback never interleave a line. Writes block while the
pipe is full: the agent must keep reading (it does, on its own thread).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, Any

from contracts.task_wire import METRICS_FD_ENV

PHASES = ("train", "epoch_end")


class Emitter:
    """Writes one JSON object per line; every method returns False instead of raising."""

    def __init__(self, stream: IO[str] | None, origin: str = "") -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._origin = origin
        self.lines_written = 0

    @property
    def enabled(self) -> bool:
        return self._stream is not None

    @classmethod
    def from_env(cls) -> Emitter:
        """Open the fd named by TFDASH_METRICS_FD, line-buffered; a disabled emitter when it is absent or bad."""
        raw = os.environ.get(METRICS_FD_ENV, "").strip()
        if not raw:
            return cls(None)
        try:
            fd = int(raw)
            stream = os.fdopen(fd, "w", buffering=1, encoding="utf-8")
        except (ValueError, OSError) as exc:
            _warn(f"{METRICS_FD_ENV}={raw!r} is not a writable file descriptor ({exc}); metrics are off")
            return cls(None)
        return cls(stream, origin=f"fd {fd}")

    def emit(self, event: dict[str, Any]) -> bool:
        if self._stream is None:
            return False
        try:
            line = json.dumps(event, separators=(",", ":"), allow_nan=False, default=str)
        except (TypeError, ValueError) as exc:  # a NaN hiding in facts, a circular structure: drop this line only
            _warn(f"dropped an unserialisable {event.get('kind')} line: {exc}")
            return False
        with self._lock:
            stream = self._stream
            if stream is None:
                return False
            try:
                stream.write(line + "\n")  # line buffering: flushed with the newline, one write per line
            except (OSError, ValueError) as exc:  # EPIPE when the agent is gone; ValueError when closed under us
                self._stream = None
                _warn(f"metrics pipe ({self._origin}) failed: {exc}; metrics are off for the rest of this run")
                return False
            self.lines_written += 1
        return True

    def metric(self, step: int, metrics: Mapping[str, Any], *, epoch: int | None = None, phase: str = "train") -> bool:
        values = finite_floats(metrics)
        if not values:
            return False
        return self.emit(
            {
                "kind": "metric",
                "ts": time.time(),
                "mono": time.monotonic(),
                "step": int(step),
                "epoch": None if epoch is None else int(epoch),
                "phase": phase,
                "metrics": values,
            }
        )

    def facts(self, facts: Mapping[str, Any]) -> bool:
        return self.emit({"kind": "facts", "ts": time.time(), "facts": dict(facts)})

    def artifact(self, name: str, path: str) -> bool:
        return self.emit({"kind": "artifact", "ts": time.time(), "name": name, "path": os.path.abspath(path)})

    def close(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def finite_floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Each value that is (or converts to) a finite float; the rest are dropped."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        number = as_float(value)
        if number is not None:
            out[str(name)] = number
    return out


def as_float(value: Any) -> float | None:
    """A finite float from a Python number, a NumPy scalar, an eager tensor or a PS RemoteValue; else None."""
    if value is None or isinstance(value, (bool, str)):
        return None
    fetch = getattr(value, "fetch", None)  # tf.distribute RemoteValue: wait for the step that produced it
    try:
        if callable(fetch) and not hasattr(value, "numpy"):
            value = fetch()
        if hasattr(value, "numpy"):  # tensors and distributed variables (float() refuses a MirroredVariable)
            value = value.numpy()
        number = float(value)
    except Exception:  # tensors with more than one element, closed remote values, ...
        return None
    return number if math.isfinite(number) else None


_emitter: Emitter | None = None
_emitter_lock = threading.Lock()


def get_emitter() -> Emitter:
    """The process's one emitter, opened from the environment on first use."""
    global _emitter
    if _emitter is None:
        with _emitter_lock:
            if _emitter is None:
                _emitter = Emitter.from_env()
    return _emitter


def _warn(message: str) -> None:
    with contextlib.suppress(Exception):  # stderr closed: nothing more to do
        print(f"tfdash: {message}", file=sys.stderr, flush=True)
