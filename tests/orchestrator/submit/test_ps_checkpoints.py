"""A built-in ParameterServer job that keeps checkpoints needs a folder every host sees (each ps writes its variables
at the chief's path on its own disk, TF_NOTES.md): on a cluster of separate machines with no shared folder it is
refused with the reason, not failed one epoch in. One machine's hosts (the local cluster) and clusters with a shared
folder are unaffected, as are jobs without checkpoints and other strategies."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from orchestrator.models import Cluster, Host, Job
from tests import factories

pytestmark = pytest.mark.django_db


def hosts_at(*addresses: str) -> None:
    for i, address in enumerate(addresses):
        host, _ = factories.host(f"node-{i}", port_min=26000 + 100 * i)
        Host.objects.filter(pk=host.pk).update(address=address, status="online", cpu_count=2, cpu_slots=2)


def submit(user, strategy: str = "parameter_server", **config) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.force_authenticate(user)
    shape = {"workers": 2, "ps": 1} if strategy == "parameter_server" else {"workers": 2}
    body = {"name": "ps", "strategy": strategy, "builtin": "digits_mlp", "builtin_config": {"epochs": 1,
            "steps_per_epoch": 5, **config}, "devices_per_worker": 1, **shape}  # fmt: skip
    answer = client.post("/api/jobs/", body, format="json")
    return answer.status_code, answer.json()


def test_it_refuses_checkpoints_across_machines_that_share_no_folder(alice):
    hosts_at("10.1.0.2", "10.1.0.3", "10.1.0.4")

    status, body = submit(alice)

    assert status == 400, body
    assert "no shared folder" in body["builtin_config.checkpoint"][0]
    assert "checkpoint: false" in body["builtin_config.checkpoint"][0]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("addresses", "shared", "strategy", "config"),
    [
        (("10.1.0.2", "10.1.0.3", "10.1.0.4"), "", "parameter_server", {"checkpoint": False}),
        (("10.1.0.2", "10.1.0.3", "10.1.0.4"), "/mnt/lab-shared", "parameter_server", {}),
        (("127.0.0.1", "127.0.0.2", "127.0.0.3"), "", "parameter_server", {}),
        (("10.1.0.2", "10.1.0.3", "10.1.0.4"), "", "multi_worker_mirrored", {}),
    ],
    ids=["without-checkpoints", "with-a-shared-folder", "one-machine", "multi-worker-mirrored"],
)
def test_it_accepts_what_can_checkpoint(alice, addresses, shared, strategy, config):  # type: ignore[no-untyped-def]
    hosts_at(*addresses)
    Cluster.objects.update(shared_dir=shared)

    status, body = submit(alice, strategy, **config)

    assert status == 201, body
