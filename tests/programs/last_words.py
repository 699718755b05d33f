"""Prints 20 numbered lines, then one last line just before it exits 0; worker i ends 0.3 s x i after worker 0
(a two-worker MultiWorkerMirrored job whose workers end at slightly different times, as in issue 22). No TF: what is
tested is the product's bookkeeping at the end of a job, not training."""

import json
import os
import time

task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"type": "worker", "index": 0})
name = f"{task['type']} {task['index']}"
for i in range(20):
    print(f"line {i} of {name}", flush=True)
time.sleep(0.3 * int(task["index"]))
print(f"last words of {name}", flush=True)
