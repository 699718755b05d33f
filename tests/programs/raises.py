"""A user script with a bug: prints a line, then raises from a few frames deep."""

from __future__ import annotations

import tensorflow as tf


def build_layer(units: int) -> None:
    raise RuntimeError("the user's bug: bad shape in layer dense_1")


def build_model() -> None:
    build_layer(32)


def main() -> None:
    print(f"tensorflow {tf.__version__}: building the model", flush=True)
    build_model()


if __name__ == "__main__":
    main()
