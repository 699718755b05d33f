"""A user's job with a secret in its arguments (and one in its config, which reaches it as TFDASH_* variables): it
runs until the test's gate file appears, while another job's task looks for both.

    waits_with_a_secret.py GATE_FILE --api-key SECRET
"""

import os
import sys
import time
from pathlib import Path

gate = Path(sys.argv[1])
print(f"RUNNING {os.getpid()}", flush=True)
deadline = time.monotonic() + 120
while not gate.exists():
    if time.monotonic() > deadline:
        sys.exit("the gate never opened")
    time.sleep(0.05)
