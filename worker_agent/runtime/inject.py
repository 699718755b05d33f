"""Metrics for an unmodified user script: `Model.fit` of tf_keras and of Keras 3 gets our callback added.

The injected hook (worker_agent/hooks/sitecustomize.py) calls `patch_keras(module)` right after `keras` or `tf_keras`
has been imported, the way MLflow's autolog patches `fit`. Every `fit` call then gets one metrics callback appended
to the user's own (theirs run as before); a `fit` that already has ours (the builtin runtime) gets none. Whatever goes
wrong in here is reported once on stderr and `fit` runs as the user wrote it.

examples_per_s needs the batch size, which Keras does not tell callbacks: it is taken from `batch_size` for arrays
(Keras' default 32 when absent) or from the `batch` step of a tf.data pipeline; when neither is known the lines
carry steps_per_s but no examples_per_s.

A user's own `BackupAndRestore` (tf_keras, Keras 2) also saves at a stop's SIGTERM, at the next step, under
(MultiWorker)Mirrored, and a restarted `fit` goes on at the step after it (preemption.py); a script without one has
no backup to resume from, and none is added (where its checkpoints go, and whether it wants them, is the user's).

`patch_coordinator` (worker_agent/runtime/coordinator.py) does the same for a ParameterServer custom loop:
`ClusterCoordinator.schedule` / `join`; what Keras schedules inside a patched `fit` is left to fit's callback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from worker_agent.runtime import preemption
from worker_agent.runtime.coordinator import inside_keras, patch_coordinator
from worker_agent.runtime.flavour import KERAS3, module_flavour
from worker_agent.runtime.input_wait import patch_make_train_function
from worker_agent.runtime.metrics import is_ours, last_step, metrics_callback_class

KERAS_DEFAULT_BATCH = 32
CALLBACKS_POSITION = 5  # fit(x, y, batch_size, epochs, verbose, callbacks, ...) in tf_keras and Keras 3 alike

__all__ = ["patch_coordinator", "patch_keras"]

_facts_sent = False
_warned: set[str] = set()


def patch_keras(module: ModuleType) -> bool:
    """Wrap `module.Model.fit` (once); True when it is wrapped now or already was."""
    model_class = getattr(module, "Model", None)
    callbacks = getattr(module, "callbacks", None)
    base = getattr(callbacks, "Callback", None)
    if model_class is None or base is None:
        _warn_once(f"patch-{module.__name__}", f"{module.__name__} has no Model/callbacks.Callback: fit not patched")
        return False
    fit = model_class.fit
    if getattr(fit, "_tfdash_patched", False):
        return True
    flavour = module_flavour(module)
    model_class.fit = _wrap_fit(fit, base, flavour)
    try:
        preemption.enable_for(flavour)
    except Exception as exc:
        _warn_once("preemption", f"saving at a stop is off: {exc!r}")
    try:  # fit's steps then sample how long they wait for input (worker_agent/runtime/input_wait.py)
        patch_make_train_function(model_class, flavour)
    except Exception as exc:
        _warn_once("input-wait", f"input-wait sampling is off: {exc!r}")
    return True


def _wrap_fit(fit: Callable[..., Any], base: type, flavour: str) -> Callable[..., Any]:
    @functools.wraps(fit)
    def patched_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            args, kwargs = with_metrics_callback(self, args, kwargs, base, flavour)
        except Exception as exc:  # never stand between the user and their training
            _warn_once("fit", f"could not add the metrics callback: {exc!r}")
        try:
            with inside_keras():  # under ParameterServer, fit schedules its steps itself: its callback reports them
                return fit(self, *args, **kwargs)
        except SystemExit as stop:  # TensorFlow's exit after saving at a stop (preemption.py): say where, then go
            ours = [cb for cb in _callbacks_of(args, kwargs) if is_ours(cb)]
            if stop.code == preemption.SAVED_AT_STOP_EXIT and ours:
                preemption.say_saved(ours[0].last_begun)
            raise

    patched_fit._tfdash_patched = True  # type: ignore[attr-defined]
    return patched_fit


def _callbacks_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    given = args[CALLBACKS_POSITION] if len(args) > CALLBACKS_POSITION else kwargs.get("callbacks")
    return list(given) if isinstance(given, (list, tuple)) else []


def with_metrics_callback(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], base: type, flavour: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    positional = len(args) > CALLBACKS_POSITION
    given = args[CALLBACKS_POSITION] if positional else kwargs.get("callbacks")
    if given is not None and not isinstance(given, (list, tuple)):  # a CallbackList the user built: leave it alone
        return args, kwargs
    callbacks = _callbacks_of(args, kwargs)
    if flavour != KERAS3:
        preemption.upgrade_backups(callbacks)
    if any(is_ours(cb) for cb in callbacks):
        return args, kwargs
    callbacks.append(_callback_for(model, args, kwargs, base, flavour, callbacks))
    if positional:
        args = (*args[:CALLBACKS_POSITION], callbacks, *args[CALLBACKS_POSITION + 1 :])
    else:
        kwargs = {**kwargs, "callbacks": callbacks}
    return args, kwargs


def _callback_for(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], base: type, flavour: str, callbacks: list[Any]
) -> Any:
    global _facts_sent
    x = kwargs["x"] if "x" in kwargs else (args[0] if args else None)
    batch_size = kwargs["batch_size"] if "batch_size" in kwargs else (args[2] if len(args) > 2 else None)
    global_batch = infer_global_batch(x, batch_size)
    strategy = getattr(model, "distribute_strategy", None)
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    share = workers_sharing_a_step(strategy)
    per_step = global_batch / share if global_batch else None
    facts = None
    if not _facts_sent:  # one facts line per process, however many fits it runs
        _facts_sent = True
        facts = {
            "source": "injected",
            "keras": flavour,
            "strategy": type(strategy).__name__ if strategy is not None else "",
            "replicas_in_sync": replicas,
            "global_batch": global_batch,
            "workers": share,
            "examples_per_step_this_task": per_step,
            "saves_at_stop": preemption.saves_at_stop(flavour, strategy, callbacks),
        }
    cls = metrics_callback_class(base)
    return cls(examples_per_step=per_step, facts=facts, step_offset=last_step())


def infer_global_batch(x: Any, batch_size: Any) -> int | None:
    """The batch size of one `fit` step, when it can be known without touching the data."""
    if isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size > 0:
        return batch_size
    node = x
    for _ in range(64):  # a tf.data pipeline: follow _input_dataset back to its `batch` step
        if node is None:
            break
        size = getattr(node, "_batch_size", None)
        if size is not None:
            try:
                return int(size)
            except (TypeError, ValueError):
                return None
        node = getattr(node, "_input_dataset", None)
    if x is not None and (hasattr(x, "shape") or isinstance(x, (list, tuple, dict))) and not hasattr(x, "element_spec"):
        return KERAS_DEFAULT_BATCH  # arrays: Keras batches them by 32 unless told otherwise
    return None


def workers_sharing_a_step(strategy: Any, environ: Any = os.environ) -> int:
    """How many processes compute one step together: the MultiWorkerMirrored workers, else 1 (one machine, or a
    ParameterServer coordinator that accounts for every step it dispatches)."""
    if strategy is None or "CollectiveAllReduce" not in type(strategy).__name__:
        return 1
    try:
        cluster = json.loads(environ.get("TF_CONFIG", "") or "{}").get("cluster", {})
        return max(1, len(cluster.get("chief", [])) + len(cluster.get("worker", [])))
    except (ValueError, AttributeError, TypeError):
        return 1


def _warn_once(key: str, message: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    print(f"tfdash: {message}", file=sys.stderr, flush=True)
