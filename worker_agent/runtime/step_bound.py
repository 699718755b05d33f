"""A preflight's step bound: with TFDASH_PREFLIGHT_STEPS=N in its environment (set only on a preflight's tasks,
orchestrator/preflight/), every `Model.fit` of the process gets a callback that stops training once N steps have run
in all (`model.stop_training`, which tf_keras and Keras 3 check after each step), so the script goes on past its fit
as it would after a normal one. A custom training loop has no fit to stop: the preflight's time limit bounds it.

Patched beside the metrics callback by the injected hook (worker_agent/hooks/sitecustomize.py), for user scripts and
the builtin programs alike. Runs inside the task's interpreter: standard library only, Python 3.9 syntax. Whatever
goes wrong here is reported once on stderr and `fit` runs as written.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from contracts.task_wire import PREFLIGHT_STEPS_ENV

CALLBACKS_POSITION = 5  # fit(x, y, batch_size, epochs, verbose, callbacks, ...) in tf_keras and Keras 3 alike

_steps_done = 0  # over every fit of the process: a second fit stops after its first step
_said = False


def bound(environ: Mapping[str, str] = os.environ) -> int | None:
    """The step bound the process was given, or None (no preflight, or a value that is no positive integer)."""
    text = environ.get(PREFLIGHT_STEPS_ENV, "").strip()
    if not text.isdigit() or int(text) <= 0:
        return None
    return int(text)


class _StepBoundLogic:
    """Mixed in before a Keras `Callback` base; see `step_bound_class`."""

    _tfdash_step_bound = True

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps
        # It never reads the logs: under ParameterServer, tf_keras allows batch-level callbacks only when they take
        # them as they come (RemoteValues), and refused this one otherwise (measured: "Batch-level `Callback`s are
        # not supported with `ParameterServerStrategy`").
        self._supports_tf_logs = True

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        global _steps_done, _said
        _steps_done += 1
        if _steps_done < self.steps:
            return
        model = getattr(self, "model", None)
        if model is not None:
            model.stop_training = True
        if not _said:
            _said = True
            print(f"tfdash: preflight: fit stopped after {_steps_done} steps", file=sys.stderr, flush=True)


_classes: dict = {}


def step_bound_class(base: type) -> type:
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = type("TfdashStepBound", (_StepBoundLogic, base), {"__module__": __name__})
    return cls


def patch_keras(module: ModuleType, steps: int | None = None) -> bool:
    """Wrap `module.Model.fit` so each fit gets the step bound (once); False when there is no bound or no fit."""
    steps = bound() if steps is None else steps
    model_class = getattr(module, "Model", None)
    base = getattr(getattr(module, "callbacks", None), "Callback", None)
    if steps is None or model_class is None or base is None:
        return False
    fit = model_class.fit
    if getattr(fit, "_tfdash_step_bound", False):
        return True
    model_class.fit = _wrap_fit(fit, step_bound_class(base), steps)
    return True


def _wrap_fit(fit: Callable[..., Any], cls: type, steps: int) -> Callable[..., Any]:
    @functools.wraps(fit)
    def bounded_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            args, kwargs = with_callback(args, kwargs, cls(steps))
        except Exception as exc:  # never stand between the user and their training
            print(f"tfdash: preflight step bound not added: {exc!r}", file=sys.stderr, flush=True)
        return fit(self, *args, **kwargs)

    bounded_fit._tfdash_step_bound = True  # type: ignore[attr-defined]
    return bounded_fit


def with_callback(args: tuple, kwargs: dict, callback: Any) -> tuple[tuple, dict]:
    """fit's arguments with `callback` added to its callbacks (a CallbackList the user built is left alone)."""
    positional = len(args) > CALLBACKS_POSITION
    given = args[CALLBACKS_POSITION] if positional else kwargs.get("callbacks")
    if given is None:
        callbacks: list = []
    elif isinstance(given, (list, tuple)):
        callbacks = list(given)
    else:
        return args, kwargs
    callbacks.append(callback)
    if positional:
        return (*args[:CALLBACKS_POSITION], callbacks, *args[CALLBACKS_POSITION + 1 :]), kwargs
    return args, {**kwargs, "callbacks": callbacks}
