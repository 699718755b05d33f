"""A user's script that works in a fixed /tmp path, as TensorFlow's tutorials do (`/tmp/my_working_dir`), the same
in /var/tmp, and in /dev/shm; then waits for the test's gate file, and reports what it sees on one `TMP <json>` line.

    fixed_tmp_path.py GATE_FILE HOST_MARKER

With a /tmp and /var/tmp of its own, every run succeeds (another job's files are not in its way) and sees only its
own files; the host's marker file (in the host's /tmp) is out of its sight.
"""

import json
import os
import sys
import time
from pathlib import Path

gate, marker = Path(sys.argv[1]), Path(sys.argv[2])
job = os.environ.get("TFDASH_JOB_ID", "?")
work = Path("/tmp/my_working_dir")
work.mkdir(exist_ok=True)  # a second job finds it: its own, or (sharing /tmp) another uid's, 0700
(work / f"job-{job}.txt").write_text(job)
var_work = Path("/var/tmp/my_working_dir")
var_work.mkdir(exist_ok=True)
(var_work / f"job-{job}.txt").write_text(job)
segment = Path("/dev/shm/tfdash-test-segment")
segment.write_text(job)
print("READY", flush=True)

deadline = time.monotonic() + 120
while not gate.exists():
    if time.monotonic() > deadline:
        sys.exit("the gate never opened")
    time.sleep(0.05)


def owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:  # gone meanwhile
        return None


report = {
    "job": job,
    "uid": os.getuid(),
    "tmpdir": os.environ.get("TMPDIR"),
    "work": sorted(os.listdir(work)),
    "var_work": sorted(os.listdir(var_work)),
    "stdin": os.readlink("/proc/self/fd/0"),
    "segment": segment.read_text(),
    "marker_seen": marker.exists(),
    "proc_uids": sorted({uid for pid in os.listdir("/proc") if pid.isdigit() and (uid := owner(pid)) is not None}),
}
print("TMP " + json.dumps(report), flush=True)
