"""The verdict and derived figures from hand-made numbers (orchestrator/core/verdict.py): no database, no TF."""

from __future__ import annotations

import pytest

from orchestrator.core.verdict import (
    VariantResult,
    is_baseline,
    replicas_of,
    scaling_efficiency,
    time_to_target,
    verdict,
)

BASE = VariantResult(
    "1-replica baseline", "mirrored", 1, "succeeded", mean_epoch_s=2.0, examples_per_s=1000.0,
    final_loss=0.30, final_accuracy=0.93, time_to_target_s=4.0, epochs_to_target=2, baseline=True,
)  # fmt: skip
MIRRORED = VariantResult(
    "Mirrored × 2 devices", "mirrored", 2, "succeeded", mean_epoch_s=3.0, examples_per_s=800.0,
    final_loss=0.32, final_accuracy=0.92, time_to_target_s=6.5, epochs_to_target=2,
)  # fmt: skip
MWMS = VariantResult(
    "MultiWorkerMirrored 2 × 1", "multi_worker_mirrored", 2, "succeeded", mean_epoch_s=8.0, examples_per_s=500.0,
    final_loss=0.35, final_accuracy=0.91, time_to_target_s=17.0, epochs_to_target=2,
)  # fmt: skip


def test_scaling_efficiency_is_throughput_over_replicas_times_the_baseline() -> None:
    assert scaling_efficiency(1500.0, 2, 1000.0) == pytest.approx(0.75)
    assert scaling_efficiency(None, 2, 1000.0) is None
    assert scaling_efficiency(1500.0, 2, None) is None
    assert scaling_efficiency(1500.0, 2, 0.0) is None


def test_replicas_and_the_baseline() -> None:
    assert replicas_of("mirrored", 1, 2) == 2
    assert replicas_of("multi_worker_mirrored", 2, 1) == 2
    assert replicas_of("parameter_server", 3, 1) == 3
    assert is_baseline("mirrored", 1, 0, 1)
    assert not is_baseline("mirrored", 1, 0, 2)
    assert not is_baseline("multi_worker_mirrored", 1, 0, 1)


def test_time_to_target_is_the_first_epoch_at_or_above_it() -> None:
    epochs = [(1, 3.0, 0.5), (2, 6.0, 0.9), (3, 9.0, 0.95)]
    assert time_to_target(epochs, 0.9) == (2, 6.0)
    assert time_to_target(epochs, 0.96) is None
    assert time_to_target([(1, 3.0, None)], 0.1) is None


def test_the_baseline_winning_on_cpu_says_distribution_is_overhead_and_gives_efficiencies() -> None:
    text = verdict([BASE, MIRRORED, MWMS], 0.9, hosts=1, gpus=False)

    assert text.startswith("1-replica baseline was the fastest to 90% accuracy: 4.0 s (epoch 2)")
    assert "Then Mirrored × 2 devices after 6.5 s, MultiWorkerMirrored 2 × 1 after 17.0 s." in text
    assert "By throughput 1-replica baseline was fastest (1,000 examples/s, 2.0 s per epoch)." in text
    assert "Mirrored × 2 devices 40%" in text and "MultiWorkerMirrored 2 × 1 25%" in text
    assert "share the same cores" in text and "does not contradict the table" in text


def test_mirrored_winning_on_one_machine_fits_the_decision_table() -> None:
    text = verdict([MIRRORED, MWMS], 0.9, hosts=1, gpus=False)

    assert text.startswith("Mirrored × 2 devices was the fastest to 90% accuracy")
    assert "This fits the decision table" in text and "MirroredStrategy" in text
    assert "Scaling efficiency" not in text  # no baseline, no efficiency


def test_multi_worker_winning_on_one_machine_contradicts_it() -> None:
    quick = VariantResult(**{**MWMS.__dict__, "time_to_target_s": 3.0, "examples_per_s": 3000.0})
    text = verdict([MIRRORED, quick], 0.9, hosts=1, gpus=False)

    assert text.startswith("MultiWorkerMirrored 2 × 1 was the fastest")
    assert "This contradicts the decision table" in text


def test_a_target_winner_that_is_not_the_throughput_winner_is_put_down_to_start_up() -> None:
    late = VariantResult(**{**MIRRORED.__dict__, "time_to_target_s": 20.0, "examples_per_s": 3000.0})
    text = verdict([late, MWMS], 0.9, hosts=1, gpus=False)

    assert text.startswith("MultiWorkerMirrored 2 × 1 was the fastest to 90% accuracy: 17.0 s")
    assert "By throughput Mirrored × 2 devices was fastest (3,000 examples/s, 3.0 s per epoch); time to target" in text
    assert "This fits the decision table: on one machine the decision table expects MirroredStrategy" in text


def test_a_tie_is_called_a_tie() -> None:
    close = VariantResult(**{**MWMS.__dict__, "time_to_target_s": 6.6})  # within 5% of 6.5 s
    text = verdict([MIRRORED, close], 0.9, hosts=2, gpus=False)

    assert "reached 90% accuracy within 5% of each other" in text and "a tie on this cluster" in text
    assert "Mirrored × 2 devices and MultiWorkerMirrored 2 × 1" in text


def test_a_failed_variant_is_left_out_and_says_why() -> None:
    failed = VariantResult("ParameterServer 2 × 1 + 1 ps", "parameter_server", 2, "failed", reason="worker 1 exited 1")
    text = verdict([MIRRORED, MWMS, failed], 0.9, hosts=1, gpus=False)

    assert text.startswith("Mirrored × 2 devices was the fastest")
    assert text.endswith("ParameterServer 2 × 1 + 1 ps failed (worker 1 exited 1) and is left out.")


def test_a_variant_that_never_reached_the_target_is_named() -> None:
    slow = VariantResult(**{**MWMS.__dict__, "time_to_target_s": None, "epochs_to_target": None, "final_accuracy": 0.8})
    text = verdict([MIRRORED, slow], 0.9, hosts=1, gpus=False)

    assert "MultiWorkerMirrored 2 × 1 never reached 90% (final accuracy 0.800)." in text


def test_none_reaching_the_target_compares_epoch_time_and_final_quality() -> None:
    a = VariantResult(**{**MIRRORED.__dict__, "time_to_target_s": None, "final_accuracy": 0.7})
    b = VariantResult(**{**MWMS.__dict__, "time_to_target_s": None, "final_accuracy": 0.8})
    text = verdict([a, b], 0.99, hosts=1, gpus=False)

    assert text.startswith("No variant reached the target of 99% accuracy.")
    assert "Mirrored × 2 devices had the shortest epochs (3.0 s)" in text
    assert "MultiWorkerMirrored 2 × 1 ended best, at loss 0.350, accuracy 0.800." in text


def test_nothing_to_compare_when_every_variant_failed() -> None:
    failed = [VariantResult(v.label, v.strategy, v.replicas, "failed", reason="boom") for v in (MIRRORED, MWMS)]
    assert verdict(failed, 0.9, hosts=1, gpus=False) == (
        "No variant finished successfully, so there is nothing to compare: Mirrored × 2 devices failed (boom); "
        "MultiWorkerMirrored 2 × 1 failed (boom)."
    )


def test_no_verdict_while_a_variant_still_runs() -> None:
    running = VariantResult(MWMS.label, MWMS.strategy, 2, "running")
    assert verdict([MIRRORED, running], 0.9, hosts=1, gpus=False) == (
        "Still running: 1 of 2 variants have ended; the verdict comes when all have."
    )
