"""What metric events cost training: examples/s with the product's metrics callback ÷ without, same process.

One process, one model, one synthetic dataset: fit() runs alternate with and without what the agent injects into
every `Model.fit`: the metrics callback (its lines go to a pipe drained by a thread, as the agent drains them) and
the input-wait sampling of fit's train function (worker_agent/runtime/input_wait.py: the "with" fits run the
sampled train function, the "without" fits Keras' own), so both sides see the same machine load. Prints every round,
the medians, the ratio (goal: >= 0.98) and how many lines carried input_wait_fraction (the measurement was on).

    .venv/bin/python bench/overhead.py [--rounds 7] [--epochs 3] [--batch 64] [--keras tf_keras|keras3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--examples", type=int, default=32768)
    parser.add_argument("--keras", choices=("tf_keras", "keras3"), default="tf_keras")
    args = parser.parse_args()
    os.environ["TF_USE_LEGACY_KERAS"] = "1" if args.keras == "tf_keras" else "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import numpy as np
    import tensorflow as tf

    from worker_agent.runtime.emitter import Emitter
    from worker_agent.runtime.input_wait import (
        SAMPLE_GAP_S,
        InputWaitRecorder,
        SampledTrainFunction,
        sampled,
    )
    from worker_agent.runtime.metrics import metrics_callback_class

    keras = tf.keras if args.keras == "tf_keras" else __import__("keras")
    read_fd, write_fd = os.pipe()
    emitter = Emitter(os.fdopen(write_fd, "w", buffering=1, encoding="utf-8"), origin="bench pipe")
    drained = {"lines": 0, "input_wait": 0}

    def drain() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for line in pipe:
                drained["lines"] += 1
                drained["input_wait"] += b'"input_wait_fraction"' in line

    threading.Thread(target=drain, daemon=True).start()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.examples, 64)).astype("float32")
    y = (x @ rng.normal(size=(64,)) > 0).astype("int64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).prefetch(tf.data.AUTOTUNE)
    model = keras.Sequential(
        [keras.Input(shape=(64,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(2)]
    )
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    model.fit(data, epochs=1, verbose=0)  # trace and warm up once, outside the measurement
    callback_class = metrics_callback_class(keras.callbacks.Callback)
    examples = args.examples * args.epochs
    bare = model.train_function
    product = sampled(model, bare, args.keras)
    if not isinstance(product, SampledTrainFunction):
        raise SystemExit("this model's train function cannot be sampled: the bench would not measure the product")

    def rate(with_metrics: bool) -> float:
        callbacks = [callback_class(examples_per_step=args.batch, emitter=emitter)] if with_metrics else []
        model.train_function = product if with_metrics else bare  # fit keeps the one it finds
        start = time.perf_counter()
        model.fit(data, epochs=args.epochs, verbose=0, callbacks=callbacks)
        return examples / (time.perf_counter() - start)

    # Each round runs three fits back to back: without, with, and without again (the control). The with/without
    # ratio of a round compares neighbours in time, so machine-load drift cancels; the median over rounds is the
    # figure. The control ratio (without/without) shows how much of any difference is this machine's noise.
    rate(True)  # the sampled path's own functions traced once, outside the measurement too
    drained["input_wait"] = 0
    without, with_, control = [], [], []
    print(f"keras={args.keras} examples/fit={examples} batch={args.batch} rounds={args.rounds}")
    for round_ in range(args.rounds):
        first = (False, True) if round_ % 2 == 0 else (True, False)  # alternate who goes first
        for with_metrics in first:
            (with_ if with_metrics else without).append(rate(with_metrics))
        control.append(rate(False))
        print(
            f"round {round_ + 1:2d}: without {without[-1]:9,.0f} ex/s   with {with_[-1]:9,.0f} ex/s   "
            f"control {control[-1]:9,.0f} ex/s"
        )
    # The same cost measured without the noise: the callback's per-batch hook called in a tight loop (windows still
    # close and lines are still written every 0.5 s), against the median step time of the fits above.
    probe = callback_class(examples_per_step=args.batch, emitter=emitter)
    probe.set_model(model)
    probe.on_train_begin({})
    probe.on_epoch_begin(0, {})
    logs = {"loss": tf.constant(0.5), "accuracy": tf.constant(0.9)}
    calls = 200_000
    start = time.perf_counter()
    for batch in range(calls):
        probe.on_train_batch_end(batch, logs)
    per_call_us = (time.perf_counter() - start) / calls * 1e6
    step_us = args.batch / statistics.median(without) * 1e6
    ratios = [w / wo for w, wo in zip(with_, without, strict=True)]
    controls = [c / wo for c, wo in zip(control, without, strict=True)]
    print(f"median without metrics: {statistics.median(without):,.0f} examples/s")
    print(
        f"median with metrics:    {statistics.median(with_):,.0f} examples/s ({emitter.lines_written} metric lines, "
        f"{drained['input_wait']} of the measured fits' lines with input_wait_fraction)"
    )
    print(f"control (without/without) median ratio: {statistics.median(controls):.3f}  <- this machine's noise")
    print(f"ratio with/without, median of paired rounds: {statistics.median(ratios):.3f} (goal >= 0.98)")
    print(
        f"per-batch hook: {per_call_us:.2f} us per call vs a {step_us:,.0f} us step -> "
        f"ratio {step_us / (step_us + per_call_us):.4f} from the hook's own cost"
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


if __name__ == "__main__":
    sys.exit(main())
