"""Registering hosts in Django admin: each bad definition is refused with its message; a good one shows its token."""

from __future__ import annotations

import re

import pytest
from django.conf import settings

from contracts.broker import without_credentials
from orchestrator.identity import tokens
from orchestrator.identity.keys import control_public_key
from orchestrator.models import Host
from tests import factories

pytestmark = pytest.mark.django_db

ADD_URL = "/admin/orchestrator/host/add/"


def host_form(cluster_id: int, **overrides: str) -> dict[str, str]:
    data = {
        "cluster": str(cluster_id),
        "name": "gpu-1",
        "address": "10.0.0.5",
        "port_min": "23000",
        "port_max": "23099",
        "cpu_slots": "",
        "labels": "",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"port_min": "80"}, "Port 80 is outside 1024–65535"),
        ({"port_max": "70000"}, "Port 70000 is outside 1024–65535"),
        ({"port_min": "23100", "port_max": "23000"}, "The range is inverted: the last port (23000) is below"),
        ({"address": "not an address!"}, "Enter an IP address or a DNS host name"),
        ({"address": "999.1.1.1"}, "Enter an IP address or a DNS host name"),
        ({"name": "GPU_1"}, "Use lower-case letters, digits and hyphens"),
        ({"labels": "gpu, fast net"}, "fast net is not"),
    ],
)
def test_it_rejects_a_bad_host_definition_with_its_message(admin_client, overrides, message):
    cluster = factories.cluster()

    response = admin_client.post(ADD_URL, host_form(cluster.pk, **overrides))

    assert response.status_code == 200  # the form again, not a redirect
    assert message in response.content.decode()
    assert not Host.objects.exists()


def test_it_rejects_a_duplicate_host_name(admin_client):
    existing, _ = factories.host("gpu-1")

    response = admin_client.post(ADD_URL, host_form(existing.cluster_id))

    assert "A host named gpu-1 is already registered in this cluster." in response.content.decode()
    assert Host.objects.count() == 1


def test_it_rejects_a_name_used_in_another_cluster(admin_client):
    factories.host("gpu-1", cluster_name="other")

    response = admin_client.post(ADD_URL, host_form(factories.cluster("lab").pk))

    assert "A host named gpu-1 is already registered in cluster other." in response.content.decode()


def test_it_shows_the_token_once_with_the_agent_commands(admin_client):
    cluster = factories.cluster()

    response = admin_client.post(ADD_URL, host_form(cluster.pk, labels="GPU, fast-net"), follow=True)

    page = response.content.decode()
    token = re.search(r"<code>(tfa_[\w-]+)</code>", page)[1]
    host = Host.objects.get(name="gpu-1")
    assert tokens.check_token(host, token)
    assert token not in host.agent_key  # only a key derived from it is stored, encrypted
    assert host.labels == "fast-net, gpu"
    # Install the agent's own distribution, join this control plane (the address the admin used), run it.
    assert "<code>python3 -m pip install ./agent</code>" in page
    join = (
        "tfdash-agent join http://testserver --host gpu-1 --token-file /etc/tfdash-agent/token "
        f"--control-key {control_public_key()}"
    )
    assert f"<code>{join}</code>" in page
    assert "<code>tfdash-agent run</code>" in page
    assert "python -m worker_agent" not in page
    # The broker is not named at all: the agent learns it by joining.
    assert without_credentials(settings.REDIS_URL) not in page
    # The control plane's own broker password is not in it: the agent signs in as its host's own user.
    assert settings.REDIS_URL.split("@")[0].split(":")[-1] not in page
    assert page.count(token) == 1  # shown once, and not on the command line (which `ps` shows)
    # Never again: the change page does not show it.
    assert token not in admin_client.get(f"/admin/orchestrator/host/{host.pk}/change/").content.decode()


def test_it_issues_a_new_token_that_replaces_the_old_one(admin_client):
    host, old_token = factories.host()

    response = admin_client.post(
        "/admin/orchestrator/host/",
        {"action": "issue_new_token", "_selected_action": [str(host.pk)]},
        follow=True,
    )

    new_token = re.search(r"<code>(tfa_[\w-]+)</code>", response.content.decode())[1]
    host.refresh_from_db()
    assert tokens.check_token(host, new_token)
    assert not tokens.check_token(host, old_token)


def test_a_hosts_page_shows_the_commands_that_put_its_agent_in_service_without_its_token(admin_client):
    host, token = factories.host("gpu-7")

    page = admin_client.get(f"/admin/orchestrator/host/{host.pk}/change/").content.decode()

    assert "<code>tfdash-agent join http://testserver --host gpu-7 --token-file /etc/tfdash-agent/token" in page
    assert "<code>tfdash-agent run</code>" in page
    assert token not in page


def test_it_lists_hosts_with_status_and_devices(admin_client):
    factories.host("cpu-box")

    page = admin_client.get("/admin/orchestrator/host/").content.decode()

    assert "cpu-box" in page
    assert "never connected" in page
    assert "no GPU" in page


def test_a_non_staff_user_cannot_reach_admin(client, django_user_model):
    user = django_user_model.objects.create_user("alice", password="pw-alice-123")
    client.force_login(user)

    response = client.get(ADD_URL)

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
