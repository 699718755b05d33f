"""A preflight's plain rules (orchestrator/core/preflight.py) and the runtime's step bound
(worker_agent/runtime/step_bound.py) on a stand-in for Keras: no database, no TensorFlow."""

from __future__ import annotations

import types

import pytest

from orchestrator.core import preflight
from worker_agent.runtime import step_bound


@pytest.mark.parametrize(
    ("asked", "workers", "gang_fits", "single_fits", "wanted"),
    [
        (None, 2, False, True, True),  # the default: a gang that must wait, one device free
        (None, 2, True, True, False),  # it starts at once: nothing to gain
        (None, 2, False, False, False),  # no device free: the preflight would wait too
        (None, 1, False, True, False),  # one worker: its preflight needs the very device it waits for
        (True, 1, True, True, True),  # asked for: always
        (False, 8, False, True, False),  # refused: never
    ],
)
def test_the_default_is_on_for_a_gang_that_must_wait_while_one_device_is_free(
    asked: bool | None, workers: int, gang_fits: bool, single_fits: bool, wanted: bool
) -> None:
    assert preflight.wanted(asked, workers, gang_fits, single_fits) is wanted


def test_the_single_worker_form_is_one_worker_on_one_device_and_a_ps_beside_it_for_parameter_server() -> None:
    assert preflight.single_worker_shape("multi_worker_mirrored", 8, 0, 4) == (1, 0, 1)
    assert preflight.single_worker_shape("mirrored", 1, 0, 8) == (1, 0, 1)
    assert preflight.single_worker_shape("parameter_server", 4, 2, 1) == (1, 1, 1)


def test_what_a_preflights_end_means_for_its_job() -> None:
    assert preflight.outcome("succeeded") == preflight.PASSED
    assert preflight.outcome("timed_out") == preflight.PASSED  # it ran its whole bound without failing
    assert preflight.outcome("failed", "missing_import") == preflight.FAILED
    assert preflight.outcome("failed", "host_lost") == preflight.SKIPPED  # the host, not the script
    assert preflight.outcome("cancelled") == preflight.SKIPPED
    assert preflight.awaited({"state": "running", "job": 7}) == 7
    assert preflight.awaited({"state": "passed", "job": 7}) is None
    assert preflight.awaited({}) is None


class _Callback:
    def __init__(self) -> None:
        self.model = None


def _fake_keras() -> types.ModuleType:
    """Enough of Keras for the bound: a Model whose fit runs `steps` batches per epoch while not stopped."""

    class Model:
        stop_training = False

        def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose=1, callbacks=None, steps=100):  # type: ignore[no-untyped-def]
            ran = 0
            for cb in callbacks or []:
                cb.model = self
            for _epoch in range(epochs):
                for batch in range(steps):
                    ran += 1
                    for cb in callbacks or []:
                        cb.on_train_batch_end(batch)
                    if self.stop_training:
                        return ran
            return ran

    module = types.ModuleType("fake_keras")
    module.Model = Model  # type: ignore[attr-defined]
    module.callbacks = types.SimpleNamespace(Callback=_Callback)  # type: ignore[attr-defined]
    return module


def test_fit_stops_after_the_bound_over_every_fit_of_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step_bound, "_steps_done", 0)
    assert step_bound.bound({"TFDASH_PREFLIGHT_STEPS": "5"}) == 5
    assert step_bound.bound({"TFDASH_PREFLIGHT_STEPS": "zero"}) is None
    assert step_bound.bound({}) is None
    keras = _fake_keras()
    assert step_bound.patch_keras(keras, steps=5)
    assert step_bound.patch_keras(keras, steps=5)  # once: not wrapped twice
    model = keras.Model()
    assert model.fit(epochs=3, steps=100) == 5  # the user's callbacks would still run: theirs come first
    user_calls: list[int] = []
    mine = _Callback()
    mine.on_train_batch_end = user_calls.append  # type: ignore[attr-defined]
    again = keras.Model()
    assert again.fit(None, None, None, 2, 1, [mine], 100) == 1  # positional callbacks kept; the bound is spent
    assert user_calls == [0]
