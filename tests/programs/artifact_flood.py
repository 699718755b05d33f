"""Floods its agent (issue 42): 1,000 artifact lines naming one file of the largest size an artifact may have (64 MiB,
each an ~85 MiB stream entry were it sent), then 32 MiB of output as fast as it can print. No TF."""

import json
import os
import sys

folder = os.environ["TFDASH_JOB_DIR"]
path = os.path.join(folder, "flood.bin")
with open(path, "wb") as out:
    out.truncate(64 * 1024 * 1024)  # cheap: sparse, reads as zeros
line = json.dumps({"kind": "artifact", "ts": 0.0, "name": "flood.bin", "path": path}) + "\n"
with os.fdopen(int(os.environ["TFDASH_METRICS_FD"]), "w") as metrics:
    for _ in range(1000):
        metrics.write(line)
chunk = ("z" * 1023 + "\n") * 1024  # 1 MiB of 1 KiB lines
for _ in range(32):
    sys.stdout.write(chunk)
sys.stdout.flush()
print("flood done", flush=True)
