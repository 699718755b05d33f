"""The fit both overhead benches run (bench/overhead.py times it, bench/overhead_instructions.py counts its
instructions): one model, one synthetic dataset, and fit() with or without what the agent injects into every
`Model.fit`: the metrics callback (its lines go to a pipe drained by a thread, as the agent drains them) and the
input-wait sampling of fit's train function (worker_agent/runtime/input_wait.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PARTS = ("both", "callback", "sampling")


def add_fit_arguments(parser: argparse.ArgumentParser, *, epochs: int, examples: int) -> None:
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--examples", type=int, default=examples)
    parser.add_argument("--keras", choices=("tf_keras", "keras3"), default="tf_keras")
    parser.add_argument("--width", type=int, default=256, help="units of each hidden layer")
    parser.add_argument("--layers", type=int, default=1, help="hidden layers (the step's compute)")
    parser.add_argument(
        "--parts",
        choices=PARTS,
        default="both",
        help="what the 'with' fits inject: the product (both), the metrics callback alone, or the sampled train "
        "function alone (sampling as while a callback reads it)",
    )
    parser.add_argument(
        "--op-threads",
        type=int,
        default=0,
        help="TensorFlow's intra- and inter-op threads (0: its own choice); 1 removes its idle threads' spin-waits",
    )


def steps_per_fit(args: argparse.Namespace) -> int:
    """Steps a fit of these options takes (an epoch's last batch may be short)."""
    return int(args.epochs * -(-args.examples // args.batch))


@dataclass
class Fit:
    """The model, its data, Keras' own train function (`bare`) and the product's (`product`), traced."""

    args: argparse.Namespace
    tf: Any
    keras: Any
    model: Any
    data: Any
    bare: Any
    product: Any
    callback_class: type
    emitter: Any
    drained: dict[str, int]  # lines the drain thread read, and those with an input-wait fraction
    min_interval_s: float | None = None  # the callback's window; None: the product's own

    @property
    def examples(self) -> int:
        return int(self.args.examples * self.args.epochs)

    @property
    def steps(self) -> int:
        return steps_per_fit(self.args)

    def run(self, with_product: bool) -> None:
        """One fit, with what the agent injects (`--parts` of it) or without."""
        parts = self.args.parts
        callbacks = []
        if with_product and parts != "sampling":
            extra = {} if self.min_interval_s is None else {"min_interval_s": self.min_interval_s}
            callbacks.append(self.callback_class(examples_per_step=self.args.batch, emitter=self.emitter, **extra))
        self.model.train_function = self.product if with_product and parts != "callback" else self.bare  # fit keeps it
        self.model.fit(self.data, epochs=self.args.epochs, verbose=0, callbacks=callbacks)


def build(args: argparse.Namespace) -> Fit:
    """Imports TensorFlow (with `--keras`'s flavour), builds and traces both paths once, outside any measurement."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1" if args.keras == "tf_keras" else "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import numpy as np
    import tensorflow as tf

    if args.op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.op_threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.op_threads)

    from worker_agent.runtime.emitter import Emitter
    from worker_agent.runtime.input_wait import SampledTrainFunction, sampled
    from worker_agent.runtime.input_wait import recorder as input_waits
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
    hidden = [keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)]
    model = keras.Sequential([keras.Input(shape=(64,)), *hidden, keras.layers.Dense(2)])
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    model.fit(data, epochs=1, verbose=0)  # trace and warm up once, outside the measurement
    bare = model.train_function
    product = sampled(model, bare, args.keras)
    if not isinstance(product, SampledTrainFunction):
        raise SystemExit("this model's train function cannot be sampled: the bench would not measure the product")
    fit = Fit(args, tf, keras, model, data, bare, product, metrics_callback_class(keras.callbacks.Callback), emitter,
              drained)  # fmt: skip
    fit.run(True)  # the sampled path's own functions traced once, outside the measurement too
    if args.parts == "sampling":
        input_waits.start()  # what a callback's on_train_begin does: the wrapper samples while someone reads it
    drained["input_wait"] = 0
    return fit
