"""Which pytest-xdist worker this test process is (0 in a run without workers), and how many there are: what the
tests' own resources are shared out by (task_uids.py, ports.py)."""

from __future__ import annotations

import os

WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
WORKER_COUNT = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
