"""The builtin programs' arrays: shipped or generated data, a fixed seeded holdout, a user's .npz checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contracts.run_config import ConfigError, parse_config
from worker_agent.runtime.data import load_arrays


def test_digits_are_scaled_features_with_a_fixed_seeded_20_percent_holdout() -> None:
    mlp = load_arrays(parse_config("digits_mlp", {}))
    assert mlp.x_train.shape == (1438, 64) and mlp.x_val.shape == (359, 64)
    assert mlp.x_train.dtype == np.float32 and mlp.x_train.min() >= 0 and mlp.x_train.max() <= 1
    assert mlp.classes == 10
    again = load_arrays(parse_config("digits_mlp", {}))
    np.testing.assert_array_equal(mlp.y_val, again.y_val)  # every task, every restart: the same split
    other = load_arrays(parse_config("digits_mlp", {"seed": 7}))
    assert not np.array_equal(mlp.y_val, other.y_val)
    cnn = load_arrays(parse_config("digits_cnn", {}))
    assert cnn.input_shape == (8, 8, 1)
    np.testing.assert_array_equal(cnn.x_train.reshape(-1, 64), mlp.x_train)


def test_synthetic_data_has_the_configured_shape() -> None:
    arrays = load_arrays(parse_config("synthetic", {"examples": 1000, "features": 12, "classes": 4}))
    assert arrays.x_train.shape == (800, 12) and arrays.x_val.shape == (200, 12)
    assert set(np.unique(arrays.y_train)) == {0, 1, 2, 3}
    assert arrays.classes == 4


def test_npz_with_and_without_validation_arrays(tmp_path: Path) -> None:
    path = tmp_path / "data.npz"
    np.savez(path, x_train=np.ones((10, 3, 3)), y_train=np.arange(10) % 3)
    arrays = load_arrays(parse_config("npz", {"data_path": str(path)}))
    assert arrays.x_train.shape == (10, 9) and arrays.x_val is None  # flattened; no holdout taken from the user's data
    assert arrays.classes == 3
    np.savez(path, x_train=np.ones((10, 4)), y_train=np.zeros(10), x_val=np.ones((2, 4)), y_val=np.array([0, 4]))
    arrays = load_arrays(parse_config("npz", {"data_path": str(path)}))
    assert arrays.x_val.shape == (2, 4) and arrays.classes == 5


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.ones((2, 2))}, "needs arrays x_train and y_train"),
        ({"x_train": np.ones((3, 2)), "y_train": np.zeros(2)}, "same, non-zero length"),
        (
            {"x_train": np.ones((3, 2)), "y_train": np.zeros(3), "x_val": np.ones((1, 5)), "y_val": np.zeros(1)},
            "do not match",
        ),
        ({"x_train": np.ones((2, 2)), "y_train": np.array([-1, 0])}, "class indices"),
    ],
)
def test_a_bad_npz_is_refused_with_a_reason(tmp_path: Path, arrays: dict[str, np.ndarray], message: str) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ConfigError, match=message):
        load_arrays(parse_config("npz", {"data_path": str(path)}))
    path.write_text("not a zip")
    with pytest.raises(ConfigError, match="cannot read"):
        load_arrays(parse_config("npz", {"data_path": str(path)}))
    np.save(tmp_path / "array.npy", np.ones(3))
    with pytest.raises(ConfigError, match=r"is not a \.npz archive"):
        load_arrays(parse_config("npz", {"data_path": str(tmp_path / "array.npy")}))
