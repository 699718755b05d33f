"""The benches' session: one migrated PostgreSQL data folder (bench/stack.py PGDATA_TEMPLATE) that every bench's
stack starts from a copy of, instead of initdb and every migration from nothing in each."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import ROOT, own_stack_env

PGDATA_TEMPLATE = "TFDASH_BENCH_PGDATA"  # bench/stack.py's


@pytest.fixture(scope="session", autouse=True)
def bench_pgdata_template() -> Iterator[Path]:
    # Under /tmp as the benches' own stacks are (pytest's folders are its user's alone; the server runs as another).
    root = Path(tempfile.mkdtemp(prefix="tfdash-bench-pgdata-"))
    folder = root / "stack"
    os.chmod(root, 0o755)  # noqa: S103 - the embedded PostgreSQL runs as its own user when we are root
    subprocess.run([sys.executable, "bench/stack.py", "pgdata", str(folder)], cwd=ROOT, env=own_stack_env(),
                   check=True, timeout=180)  # fmt: skip
    before = os.environ.get(PGDATA_TEMPLATE)
    os.environ[PGDATA_TEMPLATE] = str(folder)
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop(PGDATA_TEMPLATE, None)
        else:
            os.environ[PGDATA_TEMPLATE] = before
        shutil.rmtree(root, ignore_errors=True)
