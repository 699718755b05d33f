"""The builtin programs' data (never downloaded) and their tf.data pipelines for each strategy.

Every task of a job builds the same arrays from the same seed. The training pipeline repeats forever and `fit` runs
`steps_per_epoch` steps an epoch, so every strategy (ParameterServer needs it) counts epochs the same way.
- Mirrored / MultiWorkerMirrored: one dataset batched by the GLOBAL batch, auto-sharded by DATA: `fit` distributes it
  and each replica gets a distinct slice of every global batch (in-memory data has no files to shard by).
- ParameterServer: a `DatasetCreator`; each worker builds its own pipeline from its InputContext, reads its own shard
  and batches by the per-replica size of a step (a whole step runs on one worker). Validation runs
  ceil(val / global batch) steps over the workers' repeated shards: close to, not exactly, one pass over the holdout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contracts.run_config import VAL_FRACTION, ConfigError, RunConfig

SHUFFLE_BUFFER = 10_000
DIGITS_FILE = Path(__file__).resolve().parent / "digits.csv.gz"


@dataclass(frozen=True)
class Arrays:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray | None
    y_val: np.ndarray | None
    classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x_train.shape[1:])


def load_arrays(config: RunConfig) -> Arrays:
    if config.program in ("digits_mlp", "digits_cnn"):
        return _digits(config.seed, image=config.program == "digits_cnn")
    if config.program == "synthetic":
        return _synthetic(config)
    if config.program == "npz":
        return _npz(config.data_path)
    raise ConfigError(f"no data for program {config.program!r}")


def _digits(seed: int, *, image: bool) -> Arrays:
    # scikit-learn's copy of the data, shipped beside this module (digits.LICENSE): a task environment has no sklearn.
    table = np.loadtxt(DIGITS_FILE, delimiter=",", dtype="float64")
    x = (table[:, :-1] / 16.0).astype("float32")  # pixel values are 0..16
    y = table[:, -1].astype("int64")
    if image:
        x = x.reshape(-1, 8, 8, 1)
    return _holdout(x, y, seed, classes=10)


def _synthetic(config: RunConfig) -> Arrays:
    """Gaussian blobs around one random centre per class: learnable, and cheap to generate at any size."""
    rng = np.random.default_rng(config.seed)
    centres = rng.normal(size=(config.classes, config.features)).astype("float32")
    y = rng.integers(0, config.classes, size=config.examples).astype("int64")
    noise = rng.normal(scale=1.5, size=(config.examples, config.features)).astype("float32")
    return _holdout(centres[y] + noise, y, config.seed, classes=config.classes)


def _npz(path: str) -> Arrays:
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not hasattr(loaded, "files"):  # a bare .npy array: no names to find x_train by
        raise ConfigError(f"{path} is not a .npz archive (np.savez) with x_train and y_train")
    try:
        with loaded as data:
            names = set(data.files)
            if not {"x_train", "y_train"} <= names:
                raise ConfigError(f"{path} needs arrays x_train and y_train; it has {sorted(names)}")
            x_train, y_train = _flat(data["x_train"]), data["y_train"].astype("int64").reshape(-1)
            has_val = {"x_val", "y_val"} <= names
            x_val = _flat(data["x_val"]) if has_val else None
            y_val = data["y_val"].astype("int64").reshape(-1) if has_val else None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if len(x_train) != len(y_train) or len(x_train) == 0:
        raise ConfigError(f"{path}: x_train and y_train must have the same, non-zero length")
    if x_val is not None and (len(x_val) != len(y_val) or x_val.shape[1:] != x_train.shape[1:]):
        raise ConfigError(f"{path}: x_val/y_val do not match x_train/y_train")
    if y_train.min() < 0:
        raise ConfigError(f"{path}: labels must be class indices 0..n-1")
    classes = int(max(y_train.max(), y_val.max() if y_val is not None and len(y_val) else 0)) + 1
    return Arrays(x_train, y_train, x_val, y_val, classes=max(classes, 2))


def _flat(x: np.ndarray) -> np.ndarray:
    return x.reshape(len(x), -1).astype("float32")


def _holdout(x: np.ndarray, y: np.ndarray, seed: int, *, classes: int) -> Arrays:
    """A fixed, seeded VAL_FRACTION holdout: the same split in every task and every restart."""
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = round(len(x) * VAL_FRACTION)
    val, train = order[:n_val], order[n_val:]
    return Arrays(x[train], y[train], x[val], y[val], classes=classes)


# --- pipelines --------------------------------------------------------------------------------------------------
def _shard_by_data(tf: Any, dataset: Any) -> Any:
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def train_dataset(tf: Any, arrays: Arrays, global_batch: int, seed: int) -> Any:
    """Mirrored / MWMS: batched by the global batch; `fit` splits each batch over the replicas."""
    dataset = tf.data.Dataset.from_tensor_slices((arrays.x_train, arrays.y_train))
    dataset = dataset.shuffle(min(len(arrays.x_train), SHUFFLE_BUFFER), seed=seed).repeat()
    return _shard_by_data(tf, dataset.batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))


def val_dataset(tf: Any, arrays: Arrays, global_batch: int) -> Any | None:
    if arrays.x_val is None or not len(arrays.x_val):
        return None
    dataset = tf.data.Dataset.from_tensor_slices((arrays.x_val, arrays.y_val)).batch(global_batch)
    return _shard_by_data(tf, dataset.prefetch(tf.data.AUTOTUNE))


def ps_train_creator(keras: Any, tf: Any, arrays: Arrays, global_batch: int, seed: int) -> Any:
    """ParameterServer: each worker's own pipeline (built on the worker), its own shard of the examples."""

    def dataset_fn(context: Any) -> Any:
        batch = context.get_per_replica_batch_size(global_batch)
        dataset = tf.data.Dataset.from_tensor_slices((arrays.x_train, arrays.y_train))
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        dataset = dataset.shuffle(min(len(arrays.x_train), SHUFFLE_BUFFER), seed=seed).repeat()
        return dataset.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return keras.utils.experimental.DatasetCreator(dataset_fn)


def ps_val_creator(keras: Any, tf: Any, arrays: Arrays, global_batch: int) -> Any | None:
    if arrays.x_val is None or not len(arrays.x_val):
        return None

    def dataset_fn(context: Any) -> Any:
        batch = context.get_per_replica_batch_size(global_batch)
        dataset = tf.data.Dataset.from_tensor_slices((arrays.x_val, arrays.y_val))
        return dataset.shard(context.num_input_pipelines, context.input_pipeline_id).repeat().batch(batch)

    return keras.utils.experimental.DatasetCreator(dataset_fn)
