"""Which Keras `tf.keras` is in this environment, told without importing TensorFlow or Keras (seconds each).

TensorFlow decides it when `tf.keras` is first touched (tensorflow/python/util/lazy_loader.py, 2.15 to 2.21 alike):
TF_USE_LEGACY_KERAS set and `tf_keras` installed: tf_keras; else the installed `keras`: Keras 3 for 3.x (TF >= 2.16),
Keras 2 for 2.x (TF <= 2.15, where `keras` is the legacy Keras itself). The same rule here, read from the installed
distributions' metadata. Keras 2 and tf_keras run `model.fit` under every strategy; Keras 3 only under Mirrored.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from importlib import metadata

KERAS2 = "keras2"
TF_KERAS = "tf_keras"
KERAS3 = "keras3"
FLAVOURS = (KERAS2, TF_KERAS, KERAS3)


def legacy_keras_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """TensorFlow's own test: `tf.keras` is tf_keras exactly when TF_USE_LEGACY_KERAS is one of these."""
    return environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")


def keras_flavour(environ: Mapping[str, str] = os.environ) -> str:
    """KERAS2, TF_KERAS or KERAS3: what `tf.keras` will be in this process."""
    if legacy_keras_enabled(environ) and importlib.util.find_spec("tf_keras") is not None:
        return TF_KERAS
    if installed_version("keras").startswith("2."):
        return KERAS2
    if legacy_keras_enabled(environ):
        return TF_KERAS  # asked for but not installed: TensorFlow fails on `tf.keras`, and says so
    return KERAS3


def module_flavour(module: object) -> str:
    """The flavour of an imported `keras` or `tf_keras` module."""
    if getattr(module, "__name__", "") == "tf_keras":
        return TF_KERAS
    return KERAS2 if str(getattr(module, "__version__", "")).startswith("2.") else KERAS3


def installed_version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""
