"""A process's keeper of a lease (orchestrator/leases/keeper.py): it acts while it holds the lease, stops acting by
its own clock at the renew deadline (before anyone may take the lease over), stops at once when another took it,
and hands it back on a clean stop."""

from __future__ import annotations

import pytest
from django.db import connection

from orchestrator.leases import keeper, queue_gate, store
from orchestrator.leases.keeper import LeaseKeeper
from orchestrator.models import ControlLease
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class Clock:
    """This process's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _keeper(holder: str, clock: Clock) -> LeaseKeeper:
    return LeaseKeeper(store.SCHEDULER, holder, duration_s=15, renew_deadline_s=10, retry_s=2, clock=clock)


def test_the_first_keeper_acts_and_a_second_waits() -> None:
    clock = Clock()
    a, b = _keeper("a", clock), _keeper("b", clock)
    assert a.try_once()
    assert not b.try_once()
    assert a.acting() and not b.acting()


def test_a_holder_that_cannot_renew_stops_acting_at_its_renew_deadline() -> None:
    clock = Clock()
    a = _keeper("a", clock)
    a.try_once()
    clock.now += 9.9
    assert a.acting()
    clock.now += 0.2  # 10.1 s since the renewal was sent: 4.9 s before the database lets anyone else take it
    assert not a.acting()
    assert ControlLease.objects.get(name=store.SCHEDULER).holder == "a"  # still its row: nobody may take it yet


def test_a_holder_whose_lease_was_taken_over_stops_acting_at_its_next_try() -> None:
    clock = Clock()
    a, b = _keeper("a", clock), _keeper("b", clock)
    a.try_once()
    with connection.cursor() as cursor:  # a stalled for longer than the lease: it expired by the database's clock
        cursor.execute("UPDATE orchestrator_controllease SET expires_at = clock_timestamp() WHERE name = 'scheduler'")
    assert b.try_once()
    assert a.acting()  # it has not heard yet, and its renew deadline is not past...
    assert not a.try_once()  # ...until its next try, which finds another holder
    assert not a.acting() and b.acting()


def test_a_clean_stop_hands_the_lease_to_the_standby_at_its_next_try() -> None:
    clock = Clock()
    a, b = _keeper("a", clock), _keeper("b", clock)
    a.try_once()
    assert not b.try_once()
    a.stop(release=True)
    assert not a.acting()
    assert b.try_once()


def test_the_thread_renews_the_lease_while_it_runs() -> None:
    a = LeaseKeeper(store.BEAT, "a", duration_s=3, renew_deadline_s=2, retry_s=0.2).start()
    try:
        first = ControlLease.objects.get(name=store.BEAT).renewed_at
        wait_until(lambda: ControlLease.objects.get(name=store.BEAT).renewed_at > first, 30, what="a renewal")
        assert a.acting()
    finally:
        a.stop()


def test_a_pass_runs_where_no_lease_is_competed_for_and_only_with_it_where_one_is(monkeypatch) -> None:
    assert keeper.running(store.SCHEDULER) is None
    assert queue_gate.may_schedule()  # tests, management commands: no lease competed for
    clock = Clock()
    other, mine = _keeper("other", clock), _keeper("mine", clock)
    other.try_once()
    mine.try_once()
    monkeypatch.setitem(keeper._RUNNING, store.SCHEDULER, mine)
    assert not queue_gate.may_schedule()
    other.stop(release=True)
    mine.try_once()
    assert queue_gate.may_schedule()


def test_settings_that_would_let_two_act_are_refused() -> None:
    with pytest.raises(ValueError, match="retry < renew deadline < duration"):
        LeaseKeeper(store.BEAT, "a", duration_s=10, renew_deadline_s=10, retry_s=2)
