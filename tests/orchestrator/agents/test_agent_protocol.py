"""Which protocol a host's agent speaks (Host.agent_protocol) and why its messages are refused when the control plane
does not speak it (Host.agent_refusal, on the admin's host pages); orders to an agent one protocol behind are signed
in its protocol and carry only the launch-spec keys it knows."""

from __future__ import annotations

import json

import pytest
import redis
from django.conf import settings

from contracts.host_reports import HostFacts, HostReport
from contracts.protocol import AGENT_HEARTBEAT, AGENT_HELLO, AGENT_LAUNCH, agent_queue
from contracts.signing import WIRE_VERSION, agent_mac_key, seal
from orchestrator.agents import heartbeats, reports
from orchestrator.jobs import dispatch
from orchestrator.models import Host, HostStatus
from tests import factories

pytestmark = pytest.mark.django_db

BODY = HostReport(facts=HostFacts(cpu_count=2, memory_total_mb=1024)).to_body()


def report(host: Host, token: str, name: str, protocol: int) -> dict:
    return seal(agent_mac_key(token, host.name), host.name, name, BODY, protocol=protocol)


def test_a_hello_records_the_protocol_its_agent_speaks():
    host, token = factories.host("proto-1")

    assert reports.handle_report(report(host, token, AGENT_HELLO, 3), hello=True)

    host.refresh_from_db()
    assert (host.status, host.agent_protocol, host.agent_refusal) == (HostStatus.ONLINE, 3, "")


def test_an_upgraded_agent_is_recorded_from_its_first_heartbeat():
    host, token = factories.host("proto-2")
    assert heartbeats.apply_batch([report(host, token, AGENT_HEARTBEAT, 3)]) == 1

    assert heartbeats.apply_batch([report(host, token, AGENT_HEARTBEAT, WIRE_VERSION)]) == 1

    assert Host.objects.get(pk=host.pk).agent_protocol == WIRE_VERSION


def test_a_too_old_agent_is_refused_and_its_host_says_why_until_it_is_upgraded(admin_client):
    host, token = factories.host("proto-old")

    assert heartbeats.apply_batch([report(host, token, AGENT_HEARTBEAT, 2)]) == 0

    host.refresh_from_db()
    assert host.status == HostStatus.UNKNOWN  # nothing it says is believed
    assert host.agent_refusal.startswith("The agent speaks protocol 2, too old")
    listed = admin_client.get("/admin/orchestrator/host/").content.decode()
    detail = admin_client.get(f"/admin/orchestrator/host/{host.pk}/change/").content.decode()
    assert "The agent speaks protocol 2, too old" in listed
    assert "The agent speaks protocol 2, too old" in detail

    assert reports.handle_report(report(host, token, AGENT_HELLO, WIRE_VERSION), hello=True)  # upgraded

    host.refresh_from_db()
    assert (host.status, host.agent_protocol, host.agent_refusal) == (HostStatus.ONLINE, WIRE_VERSION, "")


def test_a_stranger_cannot_mark_a_host_refused():
    host, _token = factories.host("proto-3")

    assert heartbeats.apply_batch([report(host, "tfa_not-its-token", AGENT_HEARTBEAT, 2)]) == 0

    assert Host.objects.get(pk=host.pk).agent_refusal == ""


@pytest.mark.parametrize(("protocol", "keys_left_out"), [(3, True), (WIRE_VERSION, False)])
def test_a_launch_order_is_signed_in_its_hosts_protocol_with_only_the_keys_it_knows(alice, protocol, keys_left_out):
    host, _token = factories.host(f"proto-launch-{protocol}")
    Host.objects.filter(pk=host.pk).update(agent_protocol=protocol)
    host.refresh_from_db()
    body = {"job_id": 1, "task_id": 2, "environment": "tf-2.17", "interpreter": "/opt/tf/bin/python"}
    queue = redis.Redis.from_url(settings.REDIS_URL)
    queue.delete(agent_queue(host.name))

    dispatch._send(AGENT_LAUNCH, body, host)

    message = json.loads(queue.lpop(agent_queue(host.name)))
    order = _order(message)
    assert order["protocol"] == protocol
    assert ("environment" not in order["body"]) is keys_left_out
    assert ("interpreter" not in order["body"]) is keys_left_out
    assert order["body"]["job_id"] == 1


def _order(message: dict) -> dict:
    """The signed order inside a Celery message on the host's queue (kombu: base64 of [args, kwargs, embed])."""
    import base64

    args = json.loads(base64.b64decode(message["body"]))[0]
    return json.loads(args[0]["order"])
