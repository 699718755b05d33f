"""Built-in programs the runtime can train, by name, with a one-line description.

Plain data so the orchestrator can validate a job's choice without importing TensorFlow. The runtime
(`python -m worker_agent.runtime --program NAME --config-json JSON`) implements each; its config keys are listed in
contracts/run_config.py.
"""

from __future__ import annotations

BUILTIN_PROGRAMS: dict[str, str] = {
    "digits_mlp": "scikit-learn digits (8x8 images as 64 features in [0, 1]), MLP 64-256-256-10, seeded 20% holdout",
    "digits_cnn": "scikit-learn digits as 8x8x1 images, a small conv net (2 conv layers + dense), seeded 20% holdout",
    "synthetic": "generated, learnable classification data (examples, features, classes, hidden); for throughput work",
    "npz": "your .npz file at data_path (x_train, y_train, optional x_val, y_val); MLP on flattened features",
}
