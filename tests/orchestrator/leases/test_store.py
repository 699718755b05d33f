"""The lease rows (orchestrator/leases/store.py): taken when free, renewed by its holder only, taken over once expired
by the database's clock, handed back on a clean stop; the workers' clocks never enter."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection

from orchestrator.leases import store
from orchestrator.models import ControlLease

pytestmark = pytest.mark.django_db


def _expire(name: str) -> None:
    """The lease's time over, by the database's clock (as if its holder had died that long ago)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE orchestrator_controllease SET expires_at = clock_timestamp() - interval '1 second' WHERE name = %s",
            [name],
        )


def test_it_takes_a_free_lease_and_refuses_it_to_a_second_holder() -> None:
    assert store.take_or_renew(store.SCHEDULER, "a", 15)
    assert not store.take_or_renew(store.SCHEDULER, "b", 15)
    row = ControlLease.objects.get(name=store.SCHEDULER)
    assert row.holder == "a" and row.transitions == 0
    assert timedelta(seconds=14) < row.expires_at - row.renewed_at <= timedelta(seconds=15)


def test_its_holder_renews_it_keeping_when_it_was_acquired() -> None:
    store.take_or_renew(store.BEAT, "a", 15)
    first = ControlLease.objects.get(name=store.BEAT)
    assert store.take_or_renew(store.BEAT, "a", 15)
    again = ControlLease.objects.get(name=store.BEAT)
    assert again.acquired_at == first.acquired_at
    assert again.expires_at > first.expires_at
    assert again.transitions == 0


def test_an_expired_lease_is_taken_over_and_its_old_holder_can_no_longer_renew_it() -> None:
    store.take_or_renew(store.SCHEDULER, "a", 15)
    _expire(store.SCHEDULER)
    assert store.take_or_renew(store.SCHEDULER, "b", 15)
    assert not store.take_or_renew(store.SCHEDULER, "a", 15)
    row = ControlLease.objects.get(name=store.SCHEDULER)
    assert (row.holder, row.transitions) == ("b", 1)


def test_a_holder_that_hands_it_back_lets_the_next_take_it_at_once() -> None:
    store.take_or_renew(store.BEAT, "a", 15)
    assert not store.release(store.BEAT, "b")  # only its holder hands it back
    assert store.release(store.BEAT, "a")
    assert store.take_or_renew(store.BEAT, "b", 15)


def test_the_decision_is_the_databases_clock_not_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose clock runs years ahead cannot steal a live lease: no time of the worker's is sent."""
    store.take_or_renew(store.SCHEDULER, "a", 15)
    monkeypatch.setattr(time, "time", lambda: 4_000_000_000.0)
    assert not store.take_or_renew(store.SCHEDULER, "b", 15)
    (held,) = [h for h in store.read_all() if h.name == store.SCHEDULER]
    assert held.live and held.holder == "a"


def test_it_refuses_unknown_names_and_unbounded_durations() -> None:
    with pytest.raises(ValueError, match="no lease named"):
        store.take_or_renew("other", "a", 15)
    with pytest.raises(ValueError, match="between 0 and 3600"):
        store.take_or_renew(store.BEAT, "a", 0)


def test_identity_names_the_process_and_differs_between_two_calls() -> None:
    one, two = store.identity("scheduler@m1"), store.identity("scheduler@m1")
    assert one.startswith("scheduler@m1:") and one != two
