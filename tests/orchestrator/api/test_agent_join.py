"""`POST /api/agents/join/`: a host's agent, with a request sealed by its token's key, gets its configuration signed by
the control plane; nobody else gets anything, and a request is good once."""

from __future__ import annotations

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from contracts.join import AGENT_JOIN, JOIN_PATH, config_from
from contracts.signing import WIRE_VERSION, agent_mac_key, load_public_key, open_order, seal
from orchestrator.identity.broker_users import agent_server_url
from orchestrator.identity.keys import control_public_key
from orchestrator.models import Host
from tests import factories

pytestmark = pytest.mark.django_db


def join_request(host: str, token: str, protocol: int = WIRE_VERSION) -> dict:
    return seal(agent_mac_key(token, host), host, AGENT_JOIN, {"agent_version": "0.1.0"}, protocol=protocol)


@override_settings(TFDASH_AGENT_TASK_UIDS="20000-29999", TFDASH_AGENT_HEARTBEAT_S=2.5)
def test_a_host_gets_its_configuration_signed_by_the_control_plane():
    cluster = factories.cluster()
    cluster.shared_dir = "/mnt/lab-shared/"
    cluster.save()
    host, token = factories.host("join-1", port_min=23000)

    response = APIClient().post(JOIN_PATH, join_request(host.name, token), format="json")

    assert response.status_code == 200, response.content
    order = open_order(response.json(), load_public_key(control_public_key()), "join-1", AGENT_JOIN)
    config = config_from(order.body)
    assert config.host == "join-1"
    assert config.server == agent_server_url()  # the broker as hosts reach it, no credentials
    assert "@" not in config.server
    assert config.control_key == control_public_key()
    assert config.port_range == (23000, 23099)
    assert config.shared_roots == ["/mnt/lab-shared"]
    assert (config.task_uids, config.heartbeat_interval_s, config.protocol) == ("20000-29999", 2.5, WIRE_VERSION)


def test_an_agent_one_protocol_behind_gets_an_answer_it_can_read():
    host, token = factories.host("join-2")

    response = APIClient().post(JOIN_PATH, join_request(host.name, token, protocol=3), format="json")

    assert response.status_code == 200
    assert '"protocol":3' in response.json()["order"]


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(lambda host, token: join_request(host, "tfa_wrong"), id="another token"),
        pytest.param(lambda host, token: join_request("nobody", token), id="unknown host"),
        pytest.param(lambda host, token: {"host": host}, id="not sealed"),
        pytest.param(lambda host, token: [1, 2], id="not an object"),
        pytest.param(lambda host, token: join_request(host, token, protocol=2), id="too old"),
    ],
)
def test_anything_else_gets_one_refusal(payload):
    host, token = factories.host("join-3")

    response = APIClient().post(JOIN_PATH, payload(host.name, token), format="json")

    assert response.status_code == 403
    assert "token" not in response.json() and "order" not in response.json()


def test_a_join_request_is_good_once():
    host, token = factories.host("join-4")
    request = join_request(host.name, token)
    assert APIClient().post(JOIN_PATH, request, format="json").status_code == 200

    assert APIClient().post(JOIN_PATH, request, format="json").status_code == 403


def test_a_too_old_agent_that_tries_to_join_is_named_on_its_host():
    host, token = factories.host("join-5")

    APIClient().post(JOIN_PATH, join_request(host.name, token, protocol=2), format="json")

    assert Host.objects.get(pk=host.pk).agent_refusal.startswith("The agent speaks protocol 2, too old")
