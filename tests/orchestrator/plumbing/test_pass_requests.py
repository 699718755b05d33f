"""Asking for scheduler passes: a burst of asks costs one pass until that pass begins; an ask after it began sends a
new one; a send that fails leaves no mark behind that would swallow the next ask. Real Redis (the test database)."""

from __future__ import annotations

import time
from typing import Any

import kombu.exceptions
import pytest
import redis
from django.conf import settings
from django.db import transaction

from orchestrator.plumbing import broker_sends
from orchestrator.plumbing import pass_requests as passes


def forget_cluster() -> None:
    redis.Redis.from_url(settings.REDIS_URL).delete(passes.PENDING_KEY.format(4242), passes.BEGAN_KEY.format(4242))


@pytest.fixture
def sent(monkeypatch) -> list[Any]:
    forget_cluster()
    calls: list[Any] = []
    monkeypatch.setattr(broker_sends.app, "send_task", lambda name, args, queue, producer=None, countdown=0.0:
                        calls.append((name, args, queue)) or countdowns.append(countdown))  # fmt: skip
    countdowns.clear()
    yield calls
    forget_cluster()


countdowns: list[float] = []  # of the passes `sent` took, in order (0: at once)


def test_a_burst_of_asks_sends_one_pass_until_it_begins(sent):
    for _ in range(50):
        passes.schedule_soon(4242)
    assert sent == [(passes.SCHEDULE, [4242], "scheduler")]

    passes.pass_begins(4242)  # the pass reads the queue from here on: a later ask needs a pass of its own
    passes.schedule_soon(4242)
    assert len(sent) == 2


def test_a_failed_send_does_not_swallow_the_next_ask(monkeypatch, sent):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise kombu.exceptions.OperationalError("connection refused")

    monkeypatch.setattr(broker_sends.app, "send_task", refuse)
    passes.schedule_soon(4242)  # logged, not raised
    monkeypatch.setattr(broker_sends.app, "send_task", lambda name, args, queue, producer=None, countdown=0.0:
                        sent.append((name, args, queue)))  # fmt: skip
    passes.schedule_soon(4242)
    assert sent == [(passes.SCHEDULE, [4242], "scheduler")]


def test_asks_soon_after_a_pass_began_are_taken_by_one_pass_an_interval_after_it(sent, settings):
    """Passes over a cluster begin at least TFDASH_SCHEDULE_INTERVAL_S apart: gangs ending one after another are
    placed by one pass, not one each; after a quiet spell a pass begins at once."""
    settings.TFDASH_SCHEDULE_INTERVAL_S = 2.0
    passes.schedule_soon(4242)  # no pass for a while: at once
    passes.pass_begins(4242)
    began = time.time()
    for _ in range(20):  # ends arriving while the pass runs and after
        passes.schedule_soon(4242)
    assert len(sent) == 2
    assert countdowns[0] == 0.0
    assert 2.0 - (time.time() - began) - 0.05 <= countdowns[1] <= 2.0  # the interval since the pass began

    forget_cluster()  # that pass began long ago (its mark expired)
    passes.schedule_soon(4242)
    assert countdowns[2] == 0.0


@pytest.mark.django_db(transaction=True)
def test_a_transaction_that_asks_many_times_asks_once_per_cluster_after_it_commits(monkeypatch):
    """1,000 jobs submitted in one transaction ask for one pass, and only once they are committed."""
    asked: list[int] = []
    monkeypatch.setattr(passes, "schedule_soon", asked.append)

    with transaction.atomic():
        for _ in range(1000):
            passes.schedule_after_commit(4242)
        passes.schedule_after_commit(4243)
        assert asked == []
    assert sorted(asked) == [4242, 4243]

    with transaction.atomic():
        try:
            with transaction.atomic():  # its ask goes with the savepoint that rolls back
                passes.schedule_after_commit(4242)
                raise RuntimeError
        except RuntimeError:
            pass
        passes.schedule_after_commit(4242)  # so this one must be sent
    assert sorted(asked) == [4242, 4242, 4243]
