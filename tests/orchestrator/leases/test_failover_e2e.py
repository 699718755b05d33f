"""Two complete control planes (web, orchestrator worker with its beat, scheduler worker, webhooks worker, ingest:
each twice, as on two machines, over one PostgreSQL and one Redis) and three agents; every 25 s or so the
control plane whose scheduler holds the lease has all its processes SIGKILLed at once (each one's process group).
`bench/chaos.py --planes 2 --faults plane` does it and checks the soak's invariants; this test asks, besides, that
after every kill the other plane took over the leases the dead one held and placed a job submitted at the kill.

Where network namespaces can be made (root: tests/support/netns.py), each control plane runs in a namespace of its
own on a bridge, reaching PostgreSQL and Redis at the bridge's address, as two machines would; elsewhere both run in
this machine's root namespace (distinct process groups, node names, web ports, beat files and ingest consumer names),
and the test says so.
"""

from __future__ import annotations

import json
import sys

import pytest
from django.conf import settings

from tests.support import netns
from tests.support.processes import ROOT, ManagedProcess, own_stack_env


@pytest.mark.timeout(900)
def test_killing_the_acting_control_plane_hands_scheduling_to_the_other_losing_and_double_booking_nothing(
    tmp_path, artifacts_dir
):
    results_file = tmp_path / "failover.json"
    network, where = None, []
    reason = netns.unavailable_reason()
    if reason:
        print(f"both control planes in the root network namespace: {reason}")
    else:
        network = netns.Network(2)
        where = ["--plane-netns", ",".join(host.netns for host in network.hosts), "--bind", network.gateway]
    try:
        # 81 s of soak with a kill every 12.5-37.5 s, each plane down 1-3 s before it starts again: two kills at least.
        soak = ManagedProcess(
            "failover",
            [sys.executable, "bench/chaos.py", "--planes", "2", "--faults", "plane", "--minutes", "1.35",
             "--fault-every", "25", "--seed", "43", "--settle", "300", "--json", str(results_file), *where],
            own_stack_env(),
            cwd=ROOT,
        )  # fmt: skip
        try:
            code = soak.proc.wait(timeout=840)
        finally:
            soak.stop()
            (artifacts_dir / "failover.log").write_text(soak.output())
    finally:
        if network is not None:
            network.close()
    assert results_file.exists(), soak.output()[-4000:]
    results = json.loads(results_file.read_text())
    print(soak.output()[-2500:])
    assert results["failed"] == [], soak.output()[-4000:]
    assert code == 0
    assert "double bookings" in results["invariants"] and results["booking samples"] > 0
    assert results["faults"].get("plane", 0) >= 2
    bound = settings.TFDASH_LEASE_S + settings.TFDASH_LEASE_RETRY_S
    for took in results["takeovers"]:
        # A generous deadline (the soak waits up to 180 s), not a timing: the figures are printed above; the bound
        # the docs state is TFDASH_LEASE_S + TFDASH_LEASE_RETRY_S (17 s) for the lease, the next pass after it.
        assert "scheduler" in took and None not in took.values(), (took, bound)
    assert results["jobs succeeded"] > 0 and results["tasks checked"] > 0
