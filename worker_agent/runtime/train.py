"""`python -m worker_agent.runtime --program NAME [--config-json JSON]`: train a builtin program under the strategy
that TF_CONFIG describes, with metrics to the agent's pipe, backups for resuming, and the final model as an artifact.
The agent hands the config in env TFDASH_PROGRAM_CONFIG (a command line is readable by other local users);
`--config-json`, for a run by hand, wins over it.

Exit codes: 0 trained (or, for a ParameterServer worker/ps, never: they serve until killed); 2 refused before
training (bad arguments or config, a malformed TF_CONFIG, Keras 3 with MultiWorkerMirrored or ParameterServer);
42 stopped by SIGTERM after saving a backup at the next step (preemption.py: (MultiWorker)Mirrored with legacy
Keras); anything else is TensorFlow failing (1 from an uncaught exception).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from contracts.batching import (
    BatchPlan,
    LearningRatePlan,
    default_steps_per_epoch,
    plan_batches,
    plan_learning_rate,
)
from contracts.run_config import ConfigError, RunConfig, parse_config
from contracts.strategies import Strategy
from contracts.task_wire import PROGRAM_CONFIG_ENV
from worker_agent.runtime import checkpoints, data, models, preemption
from worker_agent.runtime.emitter import Emitter, get_emitter
from worker_agent.runtime.flavour import KERAS3, keras_flavour
from worker_agent.runtime.metrics import metrics_callback_class
from worker_agent.runtime.strategy import Role, build_strategy, read_role, serve, strategy_name

EXIT_REFUSED = 2
KERAS3_REFUSAL = (
    "Keras 3 `model.fit` does not work under {strategy} (keras-team/keras#20585): set TF_USE_LEGACY_KERAS=1 "
    "(tf_keras) for this job"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exit code is 2 too; keep its message on one line
        _refuse(f"bad arguments: {message}")


def _refuse(message: str) -> NoReturn:
    print(f"tfdash runtime: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_REFUSED)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="python -m worker_agent.runtime", description=__doc__.split("\n\n")[0])
    parser.add_argument("--program", required=True, help="a builtin program (contracts.programs.BUILTIN_PROGRAMS)")
    parser.add_argument(
        "--config-json",
        default=None,
        help=f"the program's config as a JSON object (default: env {PROGRAM_CONFIG_ENV}, else {{}})",
    )
    args = parser.parse_args(argv)
    if args.config_json is None:
        args.config_json = os.environ.get(PROGRAM_CONFIG_ENV) or "{}"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = parse_config(args.program, args.config_json)
        role = read_role()
    except ConfigError as exc:
        _refuse(str(exc))
    flavour = keras_flavour()
    if flavour == KERAS3 and role.kind != Strategy.MIRRORED:
        _refuse(KERAS3_REFUSAL.format(strategy=role.kind))
    emitter = get_emitter()
    job = checkpoints.job_dir()

    import tensorflow as tf  # after every check that can refuse: the import alone takes seconds

    if role.serves_only:
        _serve(tf, role, config, flavour, emitter)
        return 0  # not reached: a server serves until it is killed
    return _train(tf, role, config, flavour, emitter, job)


def _serve(tf: Any, role: Role, config: RunConfig, flavour: str, emitter: Emitter) -> None:
    address = role.cluster[role.task_type][role.task_index]
    facts = {
        "role": role.task_type,
        "task_index": role.task_index,
        "strategy": "ParameterServerStrategy",
        "serving": address,
        "workers": role.workers,
        "ps": len(role.cluster.get("ps", [])),
        "keras": flavour,
        "program": config.program,
        "tf_version": tf.__version__,
    }
    emitter.facts(facts)
    print(f"tfdash: {role.name} serving on {address} for the chief ({config.program})", flush=True)
    serve(tf)


def _train(tf: Any, role: Role, config: RunConfig, flavour: str, emitter: Emitter, job: Path) -> int:
    started = time.monotonic()
    strategy = build_strategy(role, tf)  # first: MWMS must start its collective server before other TF work
    keras = tf.keras
    batches = plan_batches(role.kind, config.per_replica_batch, strategy.num_replicas_in_sync, role.workers)
    arrays = data.load_arrays(config)
    steps = config.steps_per_epoch or default_steps_per_epoch(len(arrays.x_train), batches.global_batch)
    rates = plan_learning_rate(
        config.learning_rate, batches.replicas_in_sync, config.scale_lr, config.warmup_epochs, steps, config.epochs
    )
    keras.utils.set_random_seed(config.seed)

    ps = role.kind == Strategy.PARAMETER_SERVER
    if ps:
        train = data.ps_train_creator(keras, tf, arrays, batches.global_batch, config.seed)
        val = data.ps_val_creator(keras, tf, arrays, batches.global_batch)
    else:
        train = data.train_dataset(tf, arrays, batches.global_batch, config.seed)
        val = data.val_dataset(tf, arrays, batches.global_batch)
    val_steps = -(-len(arrays.x_val) // batches.global_batch) if ps and val is not None else None

    with strategy.scope():
        model = models.build_model(keras, config, arrays.input_shape, arrays.classes)
        models.compile_model(keras, model, config, rates)

    backup = checkpoints.backup_dir(job) if config.checkpoint else None
    # A stop's SIGTERM saves at the next step where TensorFlow can (not ParameterServer, not Keras 3).
    at_stop = backup is not None and not ps and preemption.enable_for(flavour)
    facts = _facts(role, config, flavour, batches, rates, backup, len(arrays.x_train), tf.__version__)
    facts["saves_at_stop"] = at_stop
    callback_class = metrics_callback_class(keras.callbacks.Callback)
    callbacks: list[Any] = [checkpoints.backup_callback(keras, job, at_stop=at_stop)] if backup is not None else []
    metrics = callback_class(
        examples_per_step=batches.examples_per_step_this_task,
        facts=facts,
        emitter=emitter,
        on_start=lambda epoch, step: print(_summary(facts, epoch, step), flush=True),
    )
    callbacks.append(metrics)
    try:
        history = model.fit(
            train,
            epochs=config.epochs,
            steps_per_epoch=steps,
            validation_data=val,
            validation_steps=val_steps,
            callbacks=callbacks,
            shuffle=False,  # the pipeline shuffles; Keras 3 warns when asked to shuffle a dataset
            verbose=2,
        )
    except SystemExit as stop:
        if stop.code == preemption.SAVED_AT_STOP_EXIT:
            preemption.say_saved(metrics.last_begun)
        raise

    saved = checkpoints.save_model(model, job, is_chief=role.is_chief, task_name=role.name)
    if saved is not None:
        emitter.artifact(saved.name, str(saved))
    final = {name: values[-1] for name, values in history.history.items() if values}
    shown = ", ".join(f"{name} {value:.4f}" for name, value in sorted(final.items()))
    print(f"tfdash: {role.name} done in {time.monotonic() - started:.1f} s: {shown or 'no epochs left to run'}")
    if saved is not None:
        print(f"tfdash: saved the model to {saved}", flush=True)
    return 0


def _facts(
    role: Role,
    config: RunConfig,
    flavour: str,
    batches: BatchPlan,
    rates: LearningRatePlan,
    backup: Path | None,
    train_examples: int,
    tf_version: str,
) -> dict[str, Any]:
    return {
        "role": role.task_type,
        "task_index": role.task_index,
        "is_chief": role.is_chief,
        "program": config.program,
        **batches.as_facts(),
        "strategy_kind": batches.strategy,
        "strategy": strategy_name(role),
        "keras": flavour,
        "tf_version": tf_version,
        **rates.as_facts(),
        "optimizer": config.optimizer,
        "train_examples": train_examples,
        "checkpoint_dir": str(backup) if backup is not None else "",
        "config": config.as_facts(),
        "pid": os.getpid(),
    }


def _summary(facts: dict[str, Any], epochs_done: int, steps_done: int) -> str:
    f = facts
    lines = [
        f"tfdash: {f['program']} on {f['strategy']} ({f['keras']}), {f['role']} {f['task_index']}"
        f"{' (chief)' if f['is_chief'] else ''}",
        f"  replicas in sync {f['replicas_in_sync']} = {f['workers']} machine(s) x {f['devices_per_machine']} device(s)"
        if f["strategy"] != "ParameterServerStrategy"
        else f"  replicas in sync {f['replicas_in_sync']} per step (each step on one of {f['workers']} workers)",
        f"  batch: {f['per_replica_batch']}/replica, {f['global_batch']} global, {f['machine_batch']}/machine, "
        f"{f['per_device_batch']}/device",
        f"  learning rate: base {f['base_learning_rate']:g}, effective {f['effective_learning_rate']:g} "
        f"(scale_lr {f['scale_lr']}), warm-up {f['warmup_epochs']:g} epochs = {f['warmup_steps']} steps",
        f"  {f['steps_per_epoch']} steps/epoch x {f['epochs']} epochs; checkpoints: {f['checkpoint_dir'] or 'off'}; "
        f"resumed from epoch {epochs_done}" + (f", step {steps_done}" if steps_done else ""),
    ]
    return "\n".join(lines)
