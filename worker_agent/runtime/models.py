"""The builtin programs' models and optimizers, written against whichever Keras `tf.keras` is (tf_keras or Keras 3).

Models end in logits (no softmax) and train with sparse categorical cross-entropy from logits.
"""

from __future__ import annotations

from typing import Any

from contracts.batching import LearningRatePlan
from contracts.run_config import RunConfig


def build_model(keras: Any, config: RunConfig, input_shape: tuple[int, ...], classes: int) -> Any:
    layers = keras.layers
    if config.program == "digits_cnn":
        body = [
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(2),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
        ]
    else:  # an MLP on flattened features: digits_mlp, synthetic, npz
        body = [layers.Flatten()] if len(input_shape) > 1 else []
        body += [layers.Dense(width, activation="relu") for width in config.hidden]
    # Built from its Input at once: BackupAndRestore needs a built model before `fit`.
    return keras.Sequential([keras.Input(shape=input_shape), *body, layers.Dense(classes)], name=config.program)


def learning_rate(keras: Any, plan: LearningRatePlan) -> Any:
    """A float, or a linear warm-up from base to effective (PolynomialDecay with power 1 rising, then flat).

    A builtin schedule rather than our own class, so the saved model loads anywhere without our code.
    """
    if plan.warmup_steps <= 0 or plan.base_learning_rate == plan.effective_learning_rate:
        return plan.effective_learning_rate
    return keras.optimizers.schedules.PolynomialDecay(
        initial_learning_rate=plan.base_learning_rate,
        decay_steps=plan.warmup_steps,
        end_learning_rate=plan.effective_learning_rate,
        power=1.0,
    )


def build_optimizer(keras: Any, config: RunConfig, plan: LearningRatePlan) -> Any:
    rate = learning_rate(keras, plan)
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(learning_rate=rate, momentum=config.momentum)
    return keras.optimizers.Adam(learning_rate=rate)


def compile_model(keras: Any, model: Any, config: RunConfig, plan: LearningRatePlan, **options: Any) -> None:
    model.compile(
        optimizer=build_optimizer(keras, config, plan),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        **options,
    )
