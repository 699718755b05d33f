"""A user's bug a few frames deep: the verdict names the user's own frame (this file, the line that raises)."""

from __future__ import annotations


def dense_layer(units: int, inputs: int) -> list[list[float]]:
    if units % inputs:
        raise ValueError(f"bad shape ({inputs}, {units}) for layer dense_1")
    return [[0.0] * units for _ in range(inputs)]


def build_model() -> None:
    dense_layer(10, 64)
    dense_layer(33, 10)


if __name__ == "__main__":
    print("building the model", flush=True)
    build_model()
