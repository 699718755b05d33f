"""REST: token auth, read for signed-in users, writes for staff only, the same validation as admin."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from orchestrator.identity import tokens
from orchestrator.identity.keys import control_public_key
from orchestrator.models import Cluster, Host
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("sam", password="pw-sam-123", is_staff=True)


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_it_refuses_anonymous_requests():
    cluster = factories.cluster()
    client = APIClient()
    for url in (
        "/api/clusters/",
        f"/api/clusters/{cluster.pk}/",
        f"/api/clusters/{cluster.pk}/hosts/",
        "/api/schema/",
    ):
        assert client.get(url).status_code == 401, url


def test_it_issues_a_token_for_username_and_password_and_accepts_it(alice):
    factories.host("gpu-1")
    client = APIClient()

    token = client.post("/api/token/", {"username": "alice", "password": "pw-alice-123"}).json()["token"]
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    clusters = client.get("/api/clusters/").json()["results"]

    assert [c["name"] for c in clusters] == ["lab"]
    assert APIClient().post("/api/token/", {"username": "alice", "password": "wrong"}).status_code == 400


def test_it_lists_hosts_with_status_heartbeat_and_devices(alice):
    host, _ = factories.host("gpu-1")
    Host.objects.filter(pk=host.pk).update(cpu_count=2, status="online")

    rows = client_for(alice).get(f"/api/clusters/{host.cluster_id}/hosts/").json()["results"]

    assert rows[0]["name"] == "gpu-1"
    assert rows[0]["address"] == "127.0.0.1"
    assert rows[0]["status"] == "online"
    assert "last_heartbeat" in rows[0]
    assert rows[0]["devices"] == ["CPU slot 0", "CPU slot 1"]
    assert "agent_token" not in rows[0]
    assert "token_hash" not in rows[0] and "agent_key" not in rows[0]


def test_a_non_staff_user_cannot_create_clusters_or_hosts(alice):
    cluster = factories.cluster()
    client = client_for(alice)

    host_response = client.post(
        f"/api/clusters/{cluster.pk}/hosts/",
        {"name": "gpu-2", "address": "10.0.0.6", "port_min": 23000, "port_max": 23099},
        format="json",
    )
    cluster_response = client.post("/api/clusters/", {"name": "mine"}, format="json")

    assert host_response.status_code == 403
    assert cluster_response.status_code == 403
    assert not Host.objects.exists()
    assert list(Cluster.objects.values_list("name", flat=True)) == ["lab"]


def test_staff_registers_a_host_and_gets_its_token_once(staff):
    cluster = factories.cluster()
    client = client_for(staff)

    body = client.post(
        f"/api/clusters/{cluster.pk}/hosts/",
        {
            "name": "gpu-2",
            "address": "gpu-2.lab.example",
            "port_min": 23000,
            "port_max": 23099,
            "labels": "gpu",
        },
        format="json",
    ).json()

    host = Host.objects.get(name="gpu-2")
    assert tokens.check_token(host, body["agent_token"])
    assert body["agent_token"] not in body["agent_command"]  # a command line shows in `ps`
    assert f"--host gpu-2 --token-file tfdash-agent.token --control-key {control_public_key()}" in body["agent_command"]
    # The agent's own distribution: install, join (the address the request came to; the key pinned), run.
    assert body["agent_commands"] == {
        "install": "python3 -m pip install ./agent",
        "join": "tfdash-agent join http://testserver --host gpu-2 --token-file /etc/tfdash-agent/token "
        f"--control-key {control_public_key()}",
        "run": "tfdash-agent run",
    }
    assert body["agent_token"] not in str(body["agent_commands"])
    assert "agent_token" not in client.get(f"/api/clusters/{cluster.pk}/hosts/{host.pk}/").json()


def test_the_agent_command_of_a_cluster_with_a_shared_folder_names_it_as_the_agents_shared_root(staff):
    cluster = factories.cluster()
    cluster.shared_dir = "/mnt/lab-shared"
    cluster.save()
    payload = {"name": "gpu-3", "address": "gpu-3.lab.example", "port_min": 23000, "port_max": 23099}

    body = client_for(staff).post(f"/api/clusters/{cluster.pk}/hosts/", payload, format="json").json()

    # The agent makes a job's folder only under its workdir and this root: the folder jobs are dispatched with.
    assert body["agent_command"].endswith("--port-range 23000-23099 --shared-root /mnt/lab-shared")


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        ({"port_min": 80}, "port_min", "Port 80 is outside 1024–65535"),
        ({"port_min": 23100, "port_max": 23000}, "port_max", "The range is inverted"),
        ({"address": "bad address"}, "address", "Enter an IP address or a DNS host name"),
        ({"name": "gpu-1"}, "name", "A host named gpu-1 is already registered in this cluster."),
    ],
)
def test_staff_gets_the_admin_validation_messages(staff, payload, field, message):
    existing, _ = factories.host("gpu-1")
    data = {"name": "gpu-9", "address": "10.0.0.9", "port_min": 23000, "port_max": 23099, **payload}

    response = client_for(staff).post(f"/api/clusters/{existing.cluster_id}/hosts/", data, format="json")

    assert response.status_code == 400
    assert message in " ".join(response.json()[field])
    assert Host.objects.count() == 1


def test_it_serves_an_openapi_schema_with_the_endpoints(alice):
    response = client_for(alice).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    paths = response.json()["paths"]
    assert "/api/clusters/" in paths
    assert "/api/clusters/{cluster_pk}/hosts/" in paths
