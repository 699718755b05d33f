"""worker_agent/runtime/preemption.py without TensorFlow: which callbacks the injected hook upgrades, and which Keras
gets the gate (the gate's effect on real TF processes: test_step_preemption.py)."""

from __future__ import annotations

from worker_agent.runtime import preemption
from worker_agent.runtime.flavour import KERAS3


class BackupAndRestore:
    """Stands in for tf_keras' / Keras 2's callback: it has `save_before_preemption`."""

    def __init__(self, save_before_preemption: bool = False) -> None:
        self.save_before_preemption = save_before_preemption


class Keras3BackupAndRestore:
    """Keras 3's has no such attribute."""


Keras3BackupAndRestore.__name__ = "BackupAndRestore"


def test_it_turns_on_saving_at_a_stop_in_a_users_legacy_backup_callbacks_only() -> None:
    off, on, keras3, other = BackupAndRestore(), BackupAndRestore(True), Keras3BackupAndRestore(), object()
    assert preemption.upgrade_backups([off, on, keras3, other]) == 1
    assert (off.save_before_preemption, on.save_before_preemption) == (True, True)
    assert not hasattr(keras3, "save_before_preemption")


def test_it_leaves_keras3_alone() -> None:
    assert preemption.enable_for(KERAS3) is False
    assert preemption.enable_for("no such keras") is False


def test_it_says_where_it_saved_once_counted_from_one(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(preemption, "_said", False)
    preemption.say_saved((3, 116))
    preemption.say_saved((3, 116))  # the builtin runtime and the injected fit both catch the exit
    out = capsys.readouterr().out
    assert out.count("stopped by SIGTERM") == 1
    assert "saved a backup after epoch 4, step 117 (its last completed)" in out


class CollectiveAllReduceStrategy:
    """MultiWorkerMirroredStrategy's class name."""


class ParameterServerStrategy:
    pass


def test_a_fit_saves_at_a_stop_with_the_gate_on_a_mirrored_strategy_and_a_backup_asking(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(preemption, "_enabled", {"tf_keras"})
    asking = [BackupAndRestore(save_before_preemption=True)]
    assert preemption.saves_at_stop("tf_keras", CollectiveAllReduceStrategy(), asking) is True
    assert preemption.saves_at_stop("tf_keras", CollectiveAllReduceStrategy(), [BackupAndRestore()]) is False
    assert preemption.saves_at_stop("tf_keras", ParameterServerStrategy(), asking) is False
    assert preemption.saves_at_stop("keras2", CollectiveAllReduceStrategy(), asking) is False  # its gate not switched
