"""A task environment in placement: the hosts that can run it carry the label env:<name>
(orchestrator/environments/availability.py); a job naming it goes only there, waits saying so when those hosts are
offline or busy, and is told it can never run when no host has it."""

from __future__ import annotations

from contracts.strategies import Strategy
from orchestrator.core.placement import Placement, Unplaceable, place
from orchestrator.core.shapes import JobShape
from tests.orchestrator.core.test_placement import host

MIRRORED = Strategy.MIRRORED


def shape(*labels: str) -> JobShape:
    return JobShape(MIRRORED, 1, 0, 1, labels=frozenset(labels))


def test_a_job_goes_only_to_hosts_that_have_its_environment() -> None:
    hosts = [host("a"), host("b", labels=frozenset({"env:tf215"}))]
    result = place(shape("env:tf215"), hosts)
    assert isinstance(result, Placement) and {t.host for t in result.tasks} == {"b"}


def test_it_waits_saying_which_hosts_it_waits_for() -> None:
    hosts = [host("a"), host("b", labels=frozenset({"env:tf215"}), online=False)]
    assert place(shape("env:tf215"), hosts) == Unplaceable("1 host with environment tf215 offline", permanent=False)
    busy = [host("a"), host("b", labels=frozenset({"env:tf215", "gpu"}), used_devices=frozenset({0, 1}))]
    result = place(shape("env:tf215", "gpu"), busy)
    assert isinstance(result, Unplaceable) and not result.permanent
    assert result.reason == "needs 1 devices on one host; largest free is 0"


def test_no_host_with_it_is_never() -> None:
    assert place(shape("env:tf215"), [host("a")]) == Unplaceable("no host with environment tf215", permanent=True)
    assert place(shape("env:tf215", "gpu"), [host("a")]) == Unplaceable(
        "no host has labels {gpu} with environment tf215", permanent=True
    )
