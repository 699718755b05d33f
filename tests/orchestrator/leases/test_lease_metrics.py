"""GET /metrics' lease families: who holds each lease now, how long until it lapses, how often it changed hands."""

from __future__ import annotations

import pytest
from django.db import connection
from prometheus_client import CollectorRegistry, generate_latest

from orchestrator.leases import store
from orchestrator.monitoring.collector import TfdashCollector

pytestmark = pytest.mark.django_db


def _scrape() -> str:
    registry = CollectorRegistry()
    registry.register(TfdashCollector())
    return generate_latest(registry).decode()


def test_it_shows_the_live_holder_and_none_once_the_lease_lapsed() -> None:
    store.take_or_renew(store.SCHEDULER, "scheduler-a@m1:12:ab", 15)
    text = _scrape()
    assert 'tfdash_lease_holder{holder="scheduler-a@m1:12:ab",lease="scheduler"} 1.0' in text
    assert 'tfdash_lease_transitions_total{lease="scheduler"} 0.0' in text
    with connection.cursor() as cursor:
        cursor.execute("UPDATE orchestrator_controllease SET expires_at = clock_timestamp() - interval '3 seconds'")
    store.take_or_renew(store.SCHEDULER, "scheduler-b@m2:34:cd", 15)
    text = _scrape()
    assert 'holder="scheduler-a@m1:12:ab"' not in text
    assert 'tfdash_lease_holder{holder="scheduler-b@m2:34:cd",lease="scheduler"} 1.0' in text
    assert 'tfdash_lease_transitions_total{lease="scheduler"} 1.0' in text
    (left,) = [line for line in text.splitlines() if line.startswith('tfdash_lease_expires_in_seconds{lease="sch')]
    assert 0 < float(left.split()[-1]) <= 15
