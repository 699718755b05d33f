"""A user's script for the cluster-uid test (issue 42): says which uid it runs as, writes a file of its own in the
job's folder (the cluster's shared folder), waits for the test's gate, then adds a line to every other task's file
there (so every task of a job must be able to write what its peers wrote) and says how that went.

    shared_folder_uid.py GATE_FILE

Lines: `UID <uid>`, then `PEERS <json>` ({file name: "ok" or the error}).
"""

import json
import os
import sys
import time
from pathlib import Path

gate = Path(sys.argv[1])
folder = Path(os.environ["TFDASH_JOB_DIR"])
mine = f"from-{os.environ.get('TFDASH_TASK_TYPE', 'task')}-{os.getpid()}.txt"
(folder / mine).write_text(f"written by uid {os.getuid()}\n")
print(f"UID {os.getuid()}", flush=True)

deadline = time.monotonic() + 120
while not gate.exists():
    if time.monotonic() > deadline:
        sys.exit("the gate never opened")
    time.sleep(0.05)

peers = {}
for other in sorted(folder.glob("from-*.txt")):
    if other.name == mine:
        continue
    try:
        with other.open("a") as file:
            file.write(f"and by uid {os.getuid()}\n")
        peers[other.name] = "ok"
    except OSError as exc:
        peers[other.name] = exc.strerror
print(f"PEERS {json.dumps(peers)}", flush=True)
