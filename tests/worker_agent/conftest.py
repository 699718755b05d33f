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
def supervisor(sent: Recorder, tmp_path: Path) -> Iterator[Supervisor]:
    sup = Supervisor(sent, tmp_path / "agent")
    yield sup
    sup.kill_all("test over", timeout=10)
