"""Behaves like a TF worker: ignores SIGTERM (unless --polite) and has a grandchild that ignores it too.

Prints "pids CHILD GRANDCHILD" (and writes it to the file after --pidfile), then sleeps until killed, or exits 0 at
once with --exit, leaving the grandchild behind.
"""

import os
import signal
import subprocess
import sys
import time

if "--grandchild" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)
    sys.exit(0)
if "--polite" not in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, __file__, "--grandchild"])
pids = f"{os.getpid()} {grandchild.pid}"
if "--pidfile" in sys.argv:
    path = sys.argv[sys.argv.index("--pidfile") + 1]
    with open(path + ".tmp", "w") as out:
        out.write(pids)
    os.replace(path + ".tmp", path)
print(f"pids {pids}", flush=True)
if "--exit" in sys.argv:
    sys.exit(0)
time.sleep(3600)
