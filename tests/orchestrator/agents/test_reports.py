"""Reports a host makes about itself are bounded: a host that lies about its size is refused, not believed."""

from __future__ import annotations

import time

import pytest

from contracts.host_reports import HostFacts, HostReport
from contracts.protocol import AGENT_HEARTBEAT, AGENT_HELLO
from orchestrator.agents import heartbeats, reports
from orchestrator.models import Host, HostStatus
from orchestrator.plumbing import counters
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

    from orchestrator.scheduler.fleet_state import host_states

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


def test_a_late_older_facts_report_leaves_the_newer_facts(settings):
    host, token = factories.host("late-0")
    now = time.time()
    timeout = settings.TFDASH_HEARTBEAT_TIMEOUT_S = 100.0  # reports up to a minute old are fresh enough here

    def report(name: str, at: float, cpus: int) -> dict:
        return sealed(host.name, token, name, HostReport(facts=HostFacts(cpus, 4096)).to_body(), now=at)

    outdated = counters.get(reports.FACTS_OUTDATED)
    assert reports.handle_report(report(AGENT_HEARTBEAT, now - timeout * 0.3, cpus=8), hello=False)
    # Sealed before the one stored (a hello that waited in the queue, a beat held back): its facts are older news.
    assert reports.handle_report(report(AGENT_HELLO, now - timeout * 0.6, cpus=2), hello=True)
    assert Host.objects.get(pk=host.pk).cpu_count == 8
    # Through the heartbeat stream's batches too: the steady beat moves the stored facts' time on, so a beat
    # sealed between the two is older news as well.
    assert heartbeats.apply_batch([report(AGENT_HEARTBEAT, now - timeout * 0.1, cpus=8)]) == 1
    assert heartbeats.apply_batch([report(AGENT_HEARTBEAT, now - timeout * 0.2, cpus=4)]) == 1

    host = Host.objects.get(pk=host.pk)
    assert (host.cpu_count, host.status) == (8, HostStatus.ONLINE)
    assert host.facts_at == pytest.approx(now - timeout * 0.1, abs=1e-3)
    assert counters.get(reports.FACTS_OUTDATED) - outdated == 2
    # A newer report's facts are stored as ever.
    assert reports.handle_report(report(AGENT_HEARTBEAT, time.time(), cpus=4), hello=False)
    assert Host.objects.get(pk=host.pk).cpu_count == 4
