"""Fixtures for the agent tests: a real Supervisor whose messages are recorded instead of sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.worker_agent.recording import Recorder
from worker_agent.supervision import Supervisor


@pytest.fixture
def sent() -> Recorder:
    return Recorder()


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """The cluster's shared folder (the supervisor's --shared-root): where a task and the test both reach a file.
    (As root a task has a /tmp of its own, so tmp_path itself is out of its sight.)"""
    folder = tmp_path / "nfs"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture
def supervisor(sent: Recorder, tmp_path: Path, shared: Path) -> Iterator[Supervisor]:
    """Its workdir is tmp_path/agent, its shared root `shared`."""
    sup = Supervisor(sent, tmp_path / "agent", shared_roots=[shared])
    yield sup
    sup.kill_all("test over", timeout=10)
