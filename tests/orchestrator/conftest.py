"""Fixtures the end-to-end orchestrator tests share."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from orchestrator.models import Cluster, Host, HostStatus
from tests import factories
from tests.support.processes import wait_until


@pytest.fixture
def api(alice) -> APIClient:  # type: ignore[no-untyped-def]
    """The REST API as alice (tests/conftest.py), who owns the jobs she submits."""
    client = APIClient()
    client.force_authenticate(alice)
    return client


@pytest.fixture
def cluster_sharing_a_folder(orchestrator, start_agent, open_tmp):  # type: ignore[no-untyped-def]
    """`make(n, prefix, first_port)`: the cluster with n hosts of 2 device slots each (ports first_port + 10 i ...
    + 9), a real agent for each, all online, and a shared folder, where checkpoints survive a restart on any host."""

    def make(n: int, prefix: str, first_port: int) -> Cluster:
        cluster = factories.cluster()
        cluster.shared_dir = str(open_tmp / "shared")
        cluster.save()
        for i in range(n):
            host, token = factories.host(f"{prefix}-{i}", port_min=first_port + 10 * i)
            Host.objects.filter(pk=host.pk).update(port_max=first_port + 10 * i + 9, cpu_slots=2)
            start_agent(host.name, token)
        wait_until(lambda: Host.objects.filter(status=HostStatus.ONLINE).count() == n, 30, what=f"{n} hosts online")
        return cluster

    return make
