"""Runs at start-up in every Python process the agent launches (this folder leads the task's PYTHONPATH).

On a CPU host a task's "devices" are logical CPU devices: with TFDASH_LOGICAL_CPU_DEVICES=N (N > 1) the first
physical CPU is split into N logical devices before user code runs, so `MirroredStrategy()` finds N replicas without
the user's script knowing. Without that variable nothing is imported: a process that is not a CPU task pays nothing.

With TFDASH_METRICS_FD set (the agent's metrics pipe), an import hook waits for `keras` (Keras 3) or `tf_keras` to be
imported — by the user, or by `tf.keras` — and then patches `Model.fit` so every fit reports metrics
(worker_agent/runtime/inject.py); likewise, once TensorFlow loads its ClusterCoordinator module, `schedule` / `join`
are patched so a ParameterServer custom loop reports steps/s and its loss (worker_agent/runtime/coordinator.py). On
a preflight's task (TFDASH_PREFLIGHT_STEPS) `fit` also stops after that many steps (worker_agent/runtime/step_bound.py).
Nothing of Keras or TensorFlow is imported for it: a script that never imports them pays for one finder on
sys.meta_path, and a script needs no change and imports nothing of ours.

Afterwards any other `sitecustomize` later on sys.path (a distribution's own) runs too, since this one shadows it.
"""

from __future__ import annotations

import os
import sys


def _split_cpu(value: str) -> None:
    try:
        count = int(value)
    except ValueError:
        print(f"tfdash: ignoring TFDASH_LOGICAL_CPU_DEVICES={value!r}: not an integer", file=sys.stderr)
        return
    if count <= 1:
        return  # one device is what TensorFlow gives anyway: no need to pay for importing it here
    try:
        import tensorflow as tf

        cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as exc:  # devices already initialised
        print(f"tfdash: could not split the CPU into {count} devices: {exc}", file=sys.stderr)
    except Exception as exc:  # no TensorFlow, no CPU listed, ...: the user's program must still run
        print(f"tfdash: could not split the CPU into {count} devices: {exc!r}", file=sys.stderr)


# Module -> the function of worker_agent.runtime.inject that patches it once it has been imported.
_PATCHES = {
    "keras": "patch_keras",
    "tf_keras": "patch_keras",
    # Where ClusterCoordinator lives; `import tensorflow` loads it (worker_agent/runtime/coordinator.py).
    "tensorflow.python.distribute.coordinator.cluster_coordinator": "patch_coordinator",
}


class _PatchingLoader:
    """Runs the real loader, then patches the module. It puts the real loader back on the module before running it,
    so nothing after the import (importlib.resources, reloads, introspection) ever sees this wrapper."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def create_module(self, spec: object) -> object:
        return self._inner.create_module(spec)  # type: ignore[attr-defined]

    def exec_module(self, module: object) -> None:
        module.__loader__ = self._inner  # type: ignore[attr-defined]
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._inner
        self._inner.exec_module(module)  # type: ignore[attr-defined]
        _patch(module)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


class _KerasImportHook:
    """A sys.meta_path finder: lets the other finders find a module of _PATCHES, then wraps the loader they chose."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname not in _PATCHES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def _patch(module: object) -> None:
    name = getattr(module, "__name__", str(module))
    try:
        from worker_agent.runtime import inject  # TF-free; found through the package root on PYTHONPATH

        getattr(inject, _PATCHES[name])(module)
    except Exception as exc:  # the user's program must still run, only without metrics
        print(f"tfdash: metrics through {name} are off: {exc!r}", file=sys.stderr)
    if os.environ.get("TFDASH_PREFLIGHT_STEPS") and _PATCHES[name] == "patch_keras":
        try:
            from worker_agent.runtime import step_bound  # a preflight: fit stops after its steps

            step_bound.patch_keras(module)
        except Exception as exc:
            print(f"tfdash: the preflight's step bound is off: {exc!r}", file=sys.stderr)


def _install_fit_hook() -> None:
    for name in _PATCHES:
        if name in sys.modules:  # imported before us (unusual): patch it now
            _patch(sys.modules[name])
    if not any(isinstance(finder, _KerasImportHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _KerasImportHook())


def _chain_next_sitecustomize() -> None:
    """Run the `sitecustomize` this module shadows, if there is one later on sys.path."""
    import importlib.machinery
    import importlib.util

    here = os.path.realpath(os.path.dirname(__file__))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or not spec.origin:
        return
    if os.path.realpath(spec.origin) == os.path.realpath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _main() -> None:
    if os.environ.get("TFDASH_METRICS_FD"):
        _install_fit_hook()  # before the CPU split, whose TensorFlow import must already find the hook in place
    value = os.environ.get("TFDASH_LOGICAL_CPU_DEVICES")
    if value:
        _split_cpu(value.strip())
    try:
        _chain_next_sitecustomize()
    except Exception as exc:
        print(f"tfdash: the next sitecustomize failed: {exc!r}", file=sys.stderr)


_main()
