"""Reports a host makes about itself are bounded: a host that lies about its size is refused, not believed."""

from __future__ import annotations

import pytest

from contracts.protocol import AGENT_HEARTBEAT, AGENT_HELLO, HostFacts, HostReport
from orchestrator.agents import reports
from orchestrator.models import Host, HostStatus
from tests import factories
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "facts",
    [HostFacts(cpu_count=2**31, memory_total_mb=1024), HostFacts(cpu_count=2, memory_total_mb=10**30)],
    ids=["2**31 CPUs", "10**30 MB"],
)
def test_a_host_claiming_an_impossible_size_is_refused_and_changes_nothing(facts, caplog):
    host, token = factories.host("liar-0")
    payload = sealed(host.name, token, AGENT_HELLO, HostReport(facts=facts).to_body())

    assert not reports.handle_report(payload, hello=True)

    host.refresh_from_db()
    assert (host.status, host.cpu_count, host.device_slots) == (HostStatus.UNKNOWN, None, 0)
    assert "sent malformed facts" in caplog.text and "is outside" in caplog.text


def test_a_host_claiming_a_million_gpus_is_refused_before_any_list_is_built():
    host, token = factories.host("liar-1")
    body = HostReport(facts=HostFacts(cpu_count=2, memory_total_mb=1)).to_body()
    body["facts"]["gpus"] = [{"index": 0, "name": "fake", "memory_total_mb": 1}] * 10**6
    payload = sealed(host.name, token, AGENT_HEARTBEAT, body)

    assert not reports.handle_report(payload, hello=False)
    assert Host.objects.get(pk=host.pk).gpus == []


def test_a_liar_keeps_the_capacity_it_had_and_handling_the_lie_allocates_nothing_of_its_size():
    import tracemalloc

    from orchestrator.control.scheduling import host_states

    host, token = factories.host("liar-2")
    honest = HostReport(facts=HostFacts(cpu_count=2, memory_total_mb=4096)).to_body()
    assert reports.handle_report(sealed(host.name, token, AGENT_HELLO, honest), hello=True)
    lies = []
    for facts in (HostFacts(cpu_count=2**31, memory_total_mb=1024), HostFacts(cpu_count=2, memory_total_mb=1)):
        body = HostReport(facts=facts).to_body()
        if facts.cpu_count == 2:
            body["facts"]["gpus"] = [{"index": 0, "name": "fake", "memory_total_mb": 1}] * 10**6
        lies.append(sealed(host.name, token, AGENT_HEARTBEAT, body))

    tracemalloc.start()
    try:
        for payload in lies:
            assert not reports.handle_report(payload, hello=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # A million GPU entries or 2**31 devices would take hundreds of MB to build; the refusal builds neither.
    assert peak < 4 * 1024 * 1024
    [state] = host_states([Host.objects.get(pk=host.pk)])
    assert state.device_ids == (0, 1)  # what it honestly reported before, not what it claimed
