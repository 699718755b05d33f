"""Real agents against a real orchestrator: registration, heartbeats, the offline watchdog, refused tokens."""

from __future__ import annotations

import time

import psutil
import pytest
from django.conf import settings

from orchestrator.models import Host, HostStatus
from tests import factories
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def fresh(host: Host) -> Host:
    return Host.objects.get(pk=host.pk)


def wait_for_status(host: Host, status: str, timeout: float) -> Host:
    return wait_until(lambda: (h := fresh(host)).status == status and h, timeout, what=f"{host.name} to be {status}")


def test_it_registers_an_agent_with_its_facts_and_keeps_heartbeating(orchestrator, start_agent):
    host, token = factories.host()
    agent = start_agent(host.name, token, "--port-range", "24000-24099")

    online = wait_for_status(host, HostStatus.ONLINE, timeout=30)

    assert online.cpu_count == psutil.cpu_count()
    assert online.memory_total_mb == psutil.virtual_memory().total // (1024 * 1024)
    assert online.gpus == []  # no NVML on this machine: reported, not an error
    assert online.gpu_error.startswith("no GPU")
    assert online.tf_version == "2.21.0"
    assert online.agent_version
    assert online.agent_pid == agent.pid
    assert online.agent_started_at is not None
    first_beat = online.last_heartbeat
    wait_until(lambda: fresh(host).last_heartbeat > first_beat, timeout=5, what="a later heartbeat")


def test_it_marks_a_killed_agent_offline_within_the_timeout_and_online_when_it_returns(orchestrator, start_agent):
    host, token = factories.host()
    agent = start_agent(host.name, token)
    wait_for_status(host, HostStatus.ONLINE, timeout=30)

    agent.kill()
    killed_at = time.monotonic()
    timeout = settings.TFDASH_HEARTBEAT_TIMEOUT_S
    wait_for_status(host, HostStatus.OFFLINE, timeout=timeout + 10)
    elapsed = time.monotonic() - killed_at
    # Not before the timeout (less the last beat's age), and within it plus one watchdog tick and some slack.
    assert timeout - 1.0 <= elapsed <= timeout + settings.TFDASH_WATCHDOG_INTERVAL_S + 3.0, elapsed

    start_agent(host.name, token)
    wait_for_status(host, HostStatus.ONLINE, timeout=30)


def test_it_refuses_a_wrong_token_and_changes_nothing(orchestrator, start_agent):
    """A wrong token derives a wrong broker password: the broker itself turns the agent away (it never reaches the
    control plane's streams), for a registered host and an unknown one alike, and says so in the agent's log."""
    host, _token = factories.host()

    wrong = start_agent(host.name, "tfa_not-the-token")
    unknown = start_agent("never-registered", "tfa_whatever")

    for agent in (wrong, unknown):
        agent.wait_for_line(r"invalid username-password pair", timeout=30)
    unchanged = fresh(host)
    assert unchanged.status == HostStatus.UNKNOWN
    assert unchanged.last_heartbeat is None
    assert unchanged.cpu_count is None
    assert not Host.objects.filter(name="never-registered").exists()
