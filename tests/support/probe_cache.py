"""The probes a test worker's agents made, handed to the agents it starts later, as a restarted agent finds its own.

An agent keeps each environment's probe in its workdir (worker_agent/environments/known.py), keyed by the
interpreter's file and its site-packages folders' times (probing.file_key), and probes only what is not there. A probe
imports TensorFlow: 3 s of CPU, and a new host takes no job before it ends. The suite's agents all run the same few
interpreters, so only the first of each (and any interpreter a test builds) needs a real probe.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from worker_agent.environments.known import FOLDER, PROBES_FILE


def probes_in(workdir: Path) -> Path:
    """Where the agent with this workdir keeps its probes."""
    return workdir / FOLDER / PROBES_FILE


def seed(workdir: Path, cache: Path) -> None:
    """Gives the agent about to start in `workdir` the cached probes, unless it has its own (a restarted agent)."""
    probes = probes_in(workdir)
    if cache.exists() and not probes.exists():
        probes.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(cache, probes)


def keep(cache: Path, workdirs: Iterable[Path]) -> None:
    """Adds what these agents probed to the cache; an unreadable file (an agent killed mid-write) adds nothing."""
    kept: dict[str, object] = {}
    for path in [cache, *(probes_in(each) for each in workdirs)]:
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(path.read_text())
            if isinstance(loaded, dict):
                kept.update(loaded)
    if kept:
        cache.write_text(json.dumps(kept))
