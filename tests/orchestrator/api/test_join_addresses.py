"""A host on another machine is not handed a loopback address at its join: with the broker as the control plane's
own 127.0.0.1 (what `make run` and a one-machine control plane use) or a store endpoint on localhost, its agent would
knock at its own machine forever. The join is refused (409) saying what to set; hosts of the control plane's own
machine, and hosts given addresses they reach, join as before."""

from __future__ import annotations

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from contracts.join import JOIN_PATH
from orchestrator.models import Cluster, Host
from tests import factories
from tests.orchestrator.api.test_agent_join import join_request

pytestmark = pytest.mark.django_db

LOOPBACK_BROKER = "redis://127.0.0.1:6379/0"
LAN_BROKER = "redis://tfdash.lab.example:6379/0"


def joined(address: str, store: str = "") -> tuple[int, str]:
    host, token = factories.host("far-1")
    Host.objects.filter(pk=host.pk).update(address=address)
    Cluster.objects.update(store_endpoint=store)
    response = APIClient().post(JOIN_PATH, join_request(host.name, token), format="json")
    return response.status_code, response.json().get("detail", "")


@override_settings(TFDASH_AGENT_SERVER_URL=LOOPBACK_BROKER)
def test_a_host_on_another_machine_is_refused_a_loopback_broker_with_what_to_set():
    status, detail = joined("10.20.0.7")

    assert status == 409
    assert "far-1 is registered at 10.20.0.7" in detail and LOOPBACK_BROKER in detail
    assert "set TFDASH_AGENT_SERVER_URL" in detail


@override_settings(TFDASH_AGENT_SERVER_URL=LAN_BROKER)
def test_a_host_on_another_machine_is_refused_a_loopback_store_endpoint():
    status, detail = joined("gpu-3.lab.example", store="http://localhost:9000")

    assert status == 409
    assert "object store endpoint, http://localhost:9000, is loopback" in detail


@pytest.mark.parametrize(
    ("broker", "address", "store"),
    [
        (LOOPBACK_BROKER, "127.0.0.2", "http://127.0.0.1:9000"),  # the local cluster: one machine
        (LAN_BROKER, "10.20.0.7", "http://minio.lab.example:9000"),
        (LAN_BROKER, "10.20.0.7", ""),
    ],
    ids=["one-machine", "addresses-hosts-reach", "no-store"],
)
def test_hosts_that_reach_what_they_are_given_join(broker, address, store):  # type: ignore[no-untyped-def]
    with override_settings(TFDASH_AGENT_SERVER_URL=broker):
        status, detail = joined(address, store)

    assert (status, detail) == (200, "")
