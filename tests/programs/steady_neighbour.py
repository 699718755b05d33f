"""A job beside a flooding one (issue 42): 100 metric points (one JSON line each, straight to the agent's metrics pipe)
and 100 numbered output lines over about 5 s, every one of which must arrive. No TF."""

import json
import os
import time

with os.fdopen(int(os.environ["TFDASH_METRICS_FD"]), "w", buffering=1) as metrics:
    for step in range(1, 101):
        point = {"kind": "metric", "ts": time.time(), "step": step, "phase": "train", "metrics": {"loss": 1.0 / step}}
        metrics.write(json.dumps(point) + "\n")
        print(f"neighbour line {step}", flush=True)
        time.sleep(0.05)
