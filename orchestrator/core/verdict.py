"""A compare-strategies experiment's numbers and its verdict, in plain Python (no Django): what each variant measured,
the derived figures (scaling efficiency, time to a target accuracy) and one paragraph in plain words saying which
variant was faster to what quality on this cluster and whether that fits TensorFlow's decision table
(contracts.strategies.STRATEGY_HINTS).

orchestrator/experiments/summary.py fills `VariantResult`s from the database; the page and the API both show
what this module computes, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts.strategies import STRATEGY_HINTS, STRATEGY_LABELS, Strategy
from orchestrator.core.job_states import SUCCEEDED, TERMINAL_JOB_STATES

# Two times within this fraction of the faster one are a tie: run-to-run noise on a shared machine is about this large.
TIE_FRACTION = 0.05


@dataclass(frozen=True)
class VariantResult:
    label: str
    strategy: str  # contracts.strategies.Strategy value
    replicas: int  # replicas in sync (data-parallel copies of the model)
    state: str  # the job's state, or "not started"
    mean_epoch_s: float | None = None
    examples_per_s: float | None = None
    final_loss: float | None = None
    final_accuracy: float | None = None
    time_to_target_s: float | None = None  # from the job's first task start to the first epoch end at the target
    epochs_to_target: int | None = None
    reason: str = ""  # why it failed, for the verdict
    baseline: bool = False


def replicas_of(strategy: str, workers: int, devices_per_worker: int) -> int:
    """Data-parallel replicas of a shape: Mirrored one per device, MultiWorkerMirrored one per device of every
    worker; a ParameterServer job trains with each worker's devices (the ps hold variables, not replicas)."""
    if Strategy(strategy) is Strategy.MIRRORED:
        return max(1, devices_per_worker)
    return max(1, workers) * max(1, devices_per_worker)


def is_baseline(strategy: str, workers: int, ps: int, devices_per_worker: int) -> bool:
    """The 1-replica baseline: one process, one device, no distribution."""
    return Strategy(strategy) is Strategy.MIRRORED and workers == 1 and ps == 0 and devices_per_worker == 1


def scaling_efficiency(
    examples_per_s: float | None, replicas: int, baseline_examples_per_s: float | None
) -> float | None:
    """throughput / (replicas x baseline throughput): 1.0 is perfect linear scaling, below 1 overhead ate some."""
    if examples_per_s is None or not baseline_examples_per_s or replicas < 1:
        return None
    return examples_per_s / (replicas * baseline_examples_per_s)


def time_to_target(epochs: Sequence[tuple[int, float | None, float | None]], target: float) -> tuple[int, float] | None:
    """(epoch number, elapsed seconds) of the first epoch whose accuracy reached `target`, from (number, elapsed_s,
    accuracy) in epoch order; None when none did (or its elapsed time is unknown)."""
    for number, elapsed, accuracy in epochs:
        if accuracy is not None and accuracy >= target:
            return (number, elapsed) if elapsed is not None else None
    return None


def _name(result: VariantResult) -> str:
    return result.label


def _s(value: float) -> str:
    return f"{value:.1f} s"


def _ties(values: list[tuple[float, VariantResult]]) -> list[VariantResult]:
    """The variants within TIE_FRACTION of the smallest value (the best first)."""
    values = sorted(values, key=lambda item: item[0])
    best = values[0][0]
    return [r for v, r in values if v <= best * (1 + TIE_FRACTION) + 1e-9]


def _hint(strategy: Strategy) -> str:
    """The form's decision-table line for a strategy, to quote inside a sentence."""
    text = STRATEGY_HINTS[strategy].rstrip(".")
    return text[0].lower() + text[1:]


def _expected(hosts: int) -> str:
    """What the decision table (contracts.strategies.STRATEGY_HINTS, as the New job form shows it) expects here."""
    if hosts <= 1:
        return f"on one machine the decision table expects MirroredStrategy ({_hint(Strategy.MIRRORED)})"
    return (
        f"on {hosts} machines the decision table expects MultiWorkerMirroredStrategy when they are alike "
        f"({_hint(Strategy.MULTI_WORKER_MIRRORED)}) and ParameterServerStrategy when they are many or unlike"
    )


def verdict(results: Sequence[VariantResult], target: float, *, hosts: int, gpus: bool) -> str:
    """One paragraph: which variant was faster to what quality, and why that fits (or contradicts) the decision
    table on this cluster (`hosts` that ran the variants; `gpus`: whether their devices are GPUs)."""
    if not results:
        return "This experiment has no variants."
    unfinished = [r for r in results if r.state not in TERMINAL_JOB_STATES]
    if unfinished:
        done = len(results) - len(unfinished)
        return f"Still running: {done} of {len(results)} variants have ended; the verdict comes when all have."
    ok = [r for r in results if r.state == SUCCEEDED]
    bad = [r for r in results if r.state != SUCCEEDED]
    sentences: list[str] = []
    if not ok:
        why = "; ".join(f"{_name(r)} {r.state}" + (f" ({r.reason})" if r.reason else "") for r in bad)
        return f"No variant finished successfully, so there is nothing to compare: {why}."

    reached = [r for r in ok if r.time_to_target_s is not None]
    winners: list[VariantResult]
    if reached:
        winners = _ties([(r.time_to_target_s, r) for r in reached])  # type: ignore[misc]
        first = winners[0]
        quality = _quality(first)
        if len(winners) > 1:
            names = " and ".join(_name(r) for r in winners)
            sentences.append(
                f"{names} reached {target:.0%} accuracy within {TIE_FRACTION:.0%} of each other "
                f"({', '.join(f'{_name(r)} {_s(r.time_to_target_s or 0)}' for r in winners)}): a tie on this cluster."
            )
        else:
            sentences.append(
                f"{_name(first)} was the fastest to {target:.0%} accuracy: {_s(first.time_to_target_s or 0)} "
                f"(epoch {first.epochs_to_target}), ending at {quality}."
            )
        others = [r for r in reached if r not in winners]
        if others:
            sentences.append(
                "Then "
                + ", ".join(
                    f"{_name(r)} after {_s(r.time_to_target_s or 0)}"
                    for r in sorted(others, key=lambda r: r.time_to_target_s or 0)
                )
                + "."
            )
        never = [r for r in ok if r.time_to_target_s is None]
        if never:
            sentences.append(
                ", ".join(_name(r) for r in never)
                + f" never reached {target:.0%} (final accuracy "
                + ", ".join("unknown" if r.final_accuracy is None else f"{r.final_accuracy:.3f}" for r in never)
                + ")."
            )
    else:
        timed = [(r.mean_epoch_s, r) for r in ok if r.mean_epoch_s is not None]
        winners = _ties(timed) if timed else [ok[0]]
        best_quality = max(ok, key=lambda r: -1.0 if r.final_accuracy is None else r.final_accuracy)
        sentences.append(
            f"No variant reached the target of {target:.0%} accuracy. "
            + (
                f"{' and '.join(_name(r) for r in winners)} had the shortest epochs "
                f"({', '.join(_s(r.mean_epoch_s) for r in winners if r.mean_epoch_s is not None)}); "
                if timed
                else ""
            )
            + f"{_name(best_quality)} ended best, at {_quality(best_quality)}."
        )

    fastest = _fastest_throughput(ok)
    if fastest is not None and len(ok) > 1:
        sentence = (
            f"By throughput {_name(fastest)} was fastest ({fastest.examples_per_s:,.0f} examples/s"
            + (f", {_s(fastest.mean_epoch_s)} per epoch" if fastest.mean_epoch_s is not None else "")
            + ")"
        )
        if reached and fastest not in winners:
            sentence += (
                "; time to target also counts start-up (launching the processes and, with several workers, "
                "connecting them), which weighs heavily in runs this short"
            )
        sentences.append(sentence + ".")

    baseline = next((r for r in ok if r.baseline), None)
    distributed = [r for r in ok if not r.baseline]
    if baseline is not None and baseline.examples_per_s:
        parts = []
        for r in distributed:
            eff = scaling_efficiency(r.examples_per_s, r.replicas, baseline.examples_per_s)
            if eff is not None:
                parts.append(f"{_name(r)} {eff:.0%}")
        if parts:
            sentences.append("Scaling efficiency against the 1-replica baseline: " + ", ".join(parts) + ".")

    # The decision table is about speed: judged by throughput where known (start-up noise aside), else by time.
    judged = [fastest] if fastest is not None else winners
    sentences.append(_fit(judged, baseline, hosts=hosts, gpus=gpus))
    if bad:
        sentences.append(
            " ".join(
                f"{_name(r)} {r.state}" + (f" ({r.reason})" if r.reason else "") + " and is left out." for r in bad
            )
        )
    return " ".join(s for s in sentences if s)


def _fastest_throughput(results: Sequence[VariantResult]) -> VariantResult | None:
    """The variant with the highest examples/s, or None when none reported it or the best two tie."""
    known = sorted((r for r in results if r.examples_per_s), key=lambda r: -(r.examples_per_s or 0))
    if not known:
        return None
    if len(known) > 1 and (known[1].examples_per_s or 0) >= (known[0].examples_per_s or 0) * (1 - TIE_FRACTION):
        return None
    return known[0]


def _quality(r: VariantResult) -> str:
    parts = []
    if r.final_loss is not None:
        parts.append(f"loss {r.final_loss:.3f}")
    if r.final_accuracy is not None:
        parts.append(f"accuracy {r.final_accuracy:.3f}")
    return ", ".join(parts) or "no reported loss or accuracy"


def _fit(winners: list[VariantResult], baseline: VariantResult | None, *, hosts: int, gpus: bool) -> str:
    """Why the outcome fits or contradicts the decision table here."""
    expected = _expected(hosts)
    won = {Strategy(r.strategy) for r in winners}
    if baseline is not None and baseline in winners:
        if not gpus:
            return (
                "The undistributed baseline was the fastest: on CPU-only hosts the replicas share the same cores, so "
                "distribution adds synchronisation and communication without adding compute. "
                f"That does not contradict the table ({expected}); it only pays off with more devices or machines "
                "than compute-bound cores."
            )
        return (
            "The undistributed baseline was the fastest, which contradicts the expectation that more devices "
            f"train faster ({expected}): the model may be too small for the devices to be kept busy."
        )
    if hosts <= 1:
        if Strategy.MIRRORED in won:
            return f"This fits the decision table: {expected}."
        winner = next(iter(won))
        return (
            f"This contradicts the decision table: {expected}, yet {STRATEGY_LABELS[winner]} won here; on one "
            "machine its extra processes can still win when one process cannot use every core."
        )
    if won & {Strategy.MULTI_WORKER_MIRRORED, Strategy.PARAMETER_SERVER}:
        return f"This fits the decision table: {expected}."
    return (
        f"This contradicts the decision table ({expected}): one machine's MirroredStrategy won, so the network "
        "between machines cost more than their extra devices gave."
    )


def is_best(values: Sequence[float | None], value: float | None, *, lower_is_better: bool) -> bool:
    """Whether `value` is the best of `values` where they differ (a tie marks nothing)."""
    known = [v for v in values if v is not None]
    if value is None or len(set(known)) < 2:
        return False
    return value == (min(known) if lower_is_better else max(known))
