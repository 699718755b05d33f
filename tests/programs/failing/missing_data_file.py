"""A data file the host lacks: the script reads a path relative to its working directory, which only the author's
laptop has."""

from __future__ import annotations

import numpy as np


def load() -> tuple:
    with np.load("data/digits_train.npz") as data:
        return data["x"], data["y"]


if __name__ == "__main__":
    x, y = load()
    print(x.shape, y.shape)
