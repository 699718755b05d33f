"""A package the host's environment lacks (an add-on this environment has no wheel for)."""

from __future__ import annotations

import tensorflow_addons as tfa  # noqa: F401

print("never reached")
