"""The garbage collector is held off for a scheduler pass and runs again after it, also when pauses on two threads
overlap or a pass fails; a collector someone else turned off stays off."""

from __future__ import annotations

import gc
import threading

import pytest

from orchestrator.plumbing import gc_pause
from orchestrator.scheduler import scheduling
from tests import factories


@pytest.fixture(autouse=True)
def _collector_on():  # type: ignore[no-untyped-def]
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_runs_again_only_when_the_last_overlapping_pause_ends():
    first_in, first_may_leave, first_out = (threading.Event() for _ in range(3))
    seen: dict[str, bool] = {}

    def first() -> None:
        with gc_pause.paused():
            first_in.set()
            first_may_leave.wait(10)
        first_out.set()

    thread = threading.Thread(target=first)
    thread.start()
    assert first_in.wait(10)
    with gc_pause.paused():
        seen["both paused"] = gc.isenabled()
        first_may_leave.set()
        assert first_out.wait(10)
        seen["after the first left"] = gc.isenabled()
    thread.join(10)
    assert seen == {"both paused": False, "after the first left": False}
    assert gc.isenabled()


def test_a_failure_inside_ends_the_pause():
    with pytest.raises(RuntimeError), gc_pause.paused():
        raise RuntimeError("the pass failed")
    assert gc.isenabled()


def test_a_collector_turned_off_by_someone_else_stays_off():
    gc.disable()
    with gc_pause.paused():
        pass
    assert not gc.isenabled()


@pytest.mark.django_db
def test_a_scheduler_pass_runs_with_the_collector_paused(alice, monkeypatch):
    host, _token = factories.host()
    seen: list[bool] = []
    real = scheduling._pass

    def watched(cluster_id: int, *, wait: bool) -> list[int]:
        seen.append(gc.isenabled())
        return real(cluster_id, wait=wait)

    monkeypatch.setattr(scheduling, "_pass", watched)
    scheduling.schedule_cluster(host.cluster_id)
    assert seen == [False]
    assert gc.isenabled()
