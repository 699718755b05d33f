"""What metric events cost training: fit time without ÷ with what the product injects, same process, in CPU time.

One process, one model, one synthetic dataset: fit() runs alternate with and without what the agent injects into
every `Model.fit`: the metrics callback (its lines go to a pipe drained by a thread, as the agent drains them) and
the input-wait sampling of fit's train function (worker_agent/runtime/input_wait.py: the "with" fits run the
sampled train function, the "without" fits Keras' own), so both sides see the same machine load.

The figure is the process's CPU time per fit (every thread: TensorFlow's, the callback's, the drain thread's), not the
wall clock: on this shared 2-core VM a fit's wall time varies by 20-25 % between identical fits (it clusters at a few
discrete rates, 26 k, 32 k, 41 k, 47 k examples/s, without and with alike), which hides a 2 % effect however many
rounds; its CPU time varies by about 4 %. The product's cost is CPU it takes from training, so this is what it
costs wherever the training is CPU-bound, and an upper bound where it waits on a GPU. The wall-clock ratio is printed
beside it, with the control (without ÷ without) that shows the machine's noise.

Rounds are ABBA pairs (without, with, with, without; the next round BAAB), so a drift in machine load cancels within
a round; the ratio of a round is its two "without" fits' time over its two "with" fits'. The figure is the median of
the rounds' ratios with a 95 % bootstrap interval (the rounds resampled, 2,000 times; seeded, so one run's output is
reproducible from its rounds). Goal: ratio >= 0.98 (the interval's lower end says whether a run shows it). One
run's 30 rounds give an interval about +-3 % wide here, wider than the effect: `--pool` reads the round lines that
earlier runs printed (their saved output) and gives the median and interval of all their rounds together, the same
statistic over more rounds.

    .venv/bin/python bench/overhead.py [--rounds 30] [--epochs 2] [--batch 64] [--keras tf_keras|keras3]
    .venv/bin/python bench/overhead.py --width 1024 --layers 2 --examples 8192 --rounds 20   # ~10 ms steps
    .venv/bin/python bench/overhead.py --parts callback    # or sampling: what one of the two costs alone
    .venv/bin/python bench/overhead.py --pool run1.log run2.log ...  # several runs' rounds as one sample, no fits

The default model (64-256-2, batch 64) steps in 0.4-1.8 ms (the VM's speed varies by day): the worst case for a cost
paid per step (what Keras does around a callback's batch hooks, the sampling wrapper); the second line's steps are
nearer a real model's. `--op-threads 1` takes TensorFlow's idle op threads out of the CPU time (their spin-waits
between steps are most of the control's noise: its interval shrank from about +-3 % to about +-1 % here), and
`--parts` says which of the two injected parts a cost belongs to. Current figures: docs/sizing.md (2026-11-28:
medians 0.969-0.993 on the default model, the parts measured back to back under 0.5 % of its step together).
bench/overhead_instructions.py counts the same fits' instructions under valgrind instead: no machine noise.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fit_fixture import add_fit_arguments, build

GOAL = 0.98


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--pool", nargs="+", type=Path, metavar="LOG", help="earlier runs' output: pool their rounds")
    add_fit_arguments(parser, epochs=2, examples=32768)
    args = parser.parse_args()
    if args.pool:
        return pool(args.pool)
    fit = build(args)
    tf, keras, model, data, bare, product = fit.tf, fit.keras, fit.model, fit.data, fit.bare, fit.product
    callback_class, emitter, drained, examples = fit.callback_class, fit.emitter, fit.drained, fit.examples

    from worker_agent.runtime.input_wait import SAMPLE_GAP_S, InputWaitRecorder, SampledTrainFunction

    def fit_times(with_metrics: bool) -> tuple[float, float]:
        """One fit's (CPU seconds of the whole process, wall seconds)."""
        cpu, wall = time.process_time(), time.perf_counter()
        fit.run(with_metrics)
        return time.process_time() - cpu, time.perf_counter() - wall

    print(
        f"keras={args.keras} examples/fit={examples} batch={args.batch} hidden={args.layers}x{args.width} "
        f"rounds={args.rounds} parts={args.parts} op-threads={args.op_threads or 'TF'} (ABBA, CPU seconds)"
    )
    cpu_ratios, wall_ratios, wall_controls, cpu_controls = [], [], [], []
    without_cpu, with_cpu = [], []
    for round_ in range(args.rounds):
        order = (False, True, True, False) if round_ % 2 == 0 else (True, False, False, True)
        fits: dict[bool, list[tuple[float, float]]] = {False: [], True: []}  # the round's two (CPU s, wall s) of each
        for with_metrics in order:
            fits[with_metrics].append(fit_times(with_metrics))
        bare_cpu, bare_wall = zip(*fits[False], strict=True)
        ours_cpu, ours_wall = zip(*fits[True], strict=True)
        cpu_ratios.append(sum(bare_cpu) / sum(ours_cpu))
        wall_ratios.append(sum(bare_wall) / sum(ours_wall))
        cpu_controls.append(bare_cpu[0] / bare_cpu[1])
        wall_controls.append(bare_wall[0] / bare_wall[1])
        without_cpu.extend(bare_cpu)
        with_cpu.extend(ours_cpu)
        print(
            f"round {round_ + 1:2d}: CPU s without {bare_cpu[0]:.3f} {bare_cpu[1]:.3f}  with "
            f"{statistics.mean(ours_cpu):.3f} (mean)  ratio {cpu_ratios[-1]:.3f}   wall ratio {wall_ratios[-1]:.3f}"
        )
    without = [examples / cpu for cpu in without_cpu]
    with_ = [examples / cpu for cpu in with_cpu]
    # The same cost measured without the noise: a step's two batch hooks as Keras dispatches them (its CallbackList,
    # with History as in every fit), with our callback and without, called in a tight loop (windows still close and
    # lines are still written every 0.5 s), against the median step time of the fits above.
    logs = {"loss": tf.constant(0.5), "accuracy": tf.constant(0.9)}
    hooks_us = {}
    for name, extra in (("without", []), ("with", [callback_class(examples_per_step=args.batch, emitter=emitter)])):
        callback_list = keras.callbacks.CallbackList(extra, add_history=True, model=model, epochs=1, steps=10**9)
        callback_list.on_train_begin()
        callback_list.on_epoch_begin(0)
        batches = iter(range(10**9))

        def one_step(callback_list: Any = callback_list, batches: Any = batches) -> None:
            batch = next(batches)
            callback_list.on_train_batch_begin(batch)
            callback_list.on_train_batch_end(batch, logs)

        for _ in range(20):  # past Keras' timing of the first batches
            one_step()
        calls = 100_000
        hooks_us[name] = min(timeit.repeat(one_step, number=calls, repeat=5)) / calls * 1e6
    per_call_us = hooks_us["with"] - hooks_us["without"]
    step_us = args.batch / statistics.median(without) * 1e6
    print(f"median without: {statistics.median(without):,.0f} examples per CPU second")
    print(
        f"median with:    {statistics.median(with_):,.0f} examples per CPU second ({emitter.lines_written} metric "
        f"lines, {drained['input_wait']} of the measured fits' lines with input_wait_fraction)"
    )
    for name, values in (("control, CPU (without/without)", cpu_controls), ("control, wall", wall_controls)):
        low, high = interval(values)
        print(f"{name}: median {statistics.median(values):.3f} [{low:.3f}, {high:.3f}]  <- this machine's noise")
    low, high = interval(wall_ratios)
    print(f"ratio without/with, wall clock: median {statistics.median(wall_ratios):.3f} [{low:.3f}, {high:.3f}]")
    low, high = interval(cpu_ratios)
    print(
        f"ratio without/with, CPU time:   median {statistics.median(cpu_ratios):.3f} [{low:.3f}, {high:.3f}] "
        f"(95 % bootstrap interval; goal >= {GOAL}: {'met' if low >= GOAL else 'not shown'} by this run)"
    )
    print(
        f"batch hooks: {hooks_us['with']:.2f} us a step with ours, {hooks_us['without']:.2f} without "
        f"(+{per_call_us:.2f} us) vs a {step_us:,.0f} us step (CPU) -> "
        f"ratio {step_us / (step_us + max(per_call_us, 0.0)):.4f} from the hooks' own cost"
    )
    # And the input-wait sampling's: a sampled step's extra time over Keras' own step, called back to back; one step
    # is sampled per SAMPLE_GAP_S of training on average, so the share it costs is extra / SAMPLE_GAP_S.
    always = InputWaitRecorder()
    always.start()
    every = SampledTrainFunction(bare, product.timed, every_steps=1, rec=always)
    iterator = iter(data.repeat())
    every(iterator)  # traced for this iterator
    bare(iterator)
    sampled_us, bare_us = [], []
    for _ in range(5):
        for function, times in ((every, sampled_us), (bare, bare_us)):
            start = time.perf_counter()
            for _ in range(100):
                function(iterator)
            times.append((time.perf_counter() - start) / 100 * 1e6)
    extra_us = statistics.median(sampled_us) - statistics.median(bare_us)
    gap_s = SAMPLE_GAP_S
    print(
        f"input-wait sampling: a sampled step {statistics.median(sampled_us):,.0f} us vs Keras' own "
        f"{statistics.median(bare_us):,.0f} us (+{extra_us:,.0f} us), one per {gap_s * 1000:.0f} ms of "
        f"training -> ratio {1 / (1 + max(extra_us, 0.0) / (gap_s * 1e6)):.4f} from the sampling's own cost"
    )
    return 0


# A round's line as main() prints it: the CPU time's ratio, then the wall clock's.
ROUND_LINE = re.compile(r"^round\s+\d+: .* ratio (\d+\.\d+)\s+wall ratio \d+\.\d+$", re.MULTILINE)


def pool(logs: list[Path]) -> int:
    """The CPU-time ratio's median and interval over every round of `logs`; exit 0 when the interval shows the
    goal, 1 when it does not, 2 when a log holds no round."""
    ratios: list[float] = []
    for log in logs:
        found = [float(cpu) for cpu in ROUND_LINE.findall(log.read_text())]
        if not found:
            print(f"{log}: no round lines (bench/overhead.py's output?)", file=sys.stderr)
            return 2
        print(f"{log}: {len(found)} rounds, median {statistics.median(found):.3f}")
        ratios.extend(found)
    low, high = interval(ratios)
    met = low >= GOAL
    print(
        f"ratio without/with, CPU time, {len(ratios)} rounds of {len(logs)} runs: median "
        f"{statistics.median(ratios):.3f} [{low:.3f}, {high:.3f}] (goal >= {GOAL}: {'met' if met else 'not shown'})"
    )
    return 0 if met else 1


def interval(values: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95 % bootstrap interval of the median of `values` (resampled with replacement)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


if __name__ == "__main__":
    sys.exit(main())
