"""Prints what the supervisor gave it as one JSON line: its environment, cwd, and what start-up imported."""

import importlib.util
import json
import os
import sys

print(
    json.dumps(
        {
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "worker_agent_importable": importlib.util.find_spec("worker_agent") is not None,
            "worker_agent_origin": getattr(importlib.util.find_spec("worker_agent"), "origin", None),
            "tensorflow_loaded": "tensorflow" in sys.modules,
            "chained": getattr(sys, "tfdash_test_chained", False),
        }
    )
)
