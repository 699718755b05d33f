"""Level-triggered: a host whose heartbeat reports other environments than its cluster registered (its order was lost,
or refused as stale) is told them again, at most every RETELL_S; one that reports them is left alone."""

from __future__ import annotations

import pytest
import redis

from contracts.host_reports import EnvironmentFacts, HostFacts
from contracts.protocol import agent_queue
from orchestrator.environments import orders
from orchestrator.models import TaskEnvironment
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_host_behind_is_told_again_and_not_at_every_beat(redis_url, monkeypatch) -> None:
    host, _token = factories.host("retell-1")
    TaskEnvironment.objects.create(cluster=host.cluster, name="main", interpreter="/opt/tf/bin/python", is_default=True)
    monkeypatch.setattr(orders, "_registered_at", float("-inf"))
    queue = redis.Redis.from_url(redis_url)
    queue.delete(agent_queue(host.name))
    behind = HostFacts(cpu_count=2, memory_total_mb=1000)
    probed = EnvironmentFacts("main", "/opt/tf/bin/python", True, tensorflow="2.17.0")
    up_to_date = HostFacts(cpu_count=2, memory_total_mb=1000, environments=[probed])

    assert orders.converge([(host, up_to_date)]) == []
    assert orders.converge([(host, behind)]) == [host.name]
    assert queue.llen(agent_queue(host.name)) == 1  # the signed order, on the host's own queue
    assert orders.converge([(host, behind)]) == []  # not again within RETELL_S
    monkeypatch.setitem(orders._told, host.pk, float("-inf"))
    assert orders.converge([(host, behind)]) == [host.name]
    queue.delete(agent_queue(host.name))
