"""Host facts: read for real on this machine, and re-read only every refresh period by the heartbeat."""

from __future__ import annotations

import os

import psutil
import pytest

from worker_agent import facts


def test_the_facts_describe_this_machine_and_say_no_gpu_here():
    read = facts.collect((23000, 23099))

    assert read.cpu_count == psutil.cpu_count(logical=True)
    assert read.pid == os.getpid() and read.port_range == (23000, 23099)
    assert read.tf_version.startswith("2.")
    if not read.gpus:  # this machine: no NVML, which is reported, not an error
        assert read.gpu_error


def test_heartbeats_reuse_the_facts_until_the_refresh_period_ends(monkeypatch: pytest.MonkeyPatch):
    calls = []
    monkeypatch.setattr(facts, "collect", lambda port_range: calls.append(port_range) or len(calls))
    clock = [100.0]
    cached = facts.RefreshingFacts((1, 2), refresh_s=60, clock=lambda: clock[0])

    assert [cached(), cached()] == [1, 1]
    clock[0] += 59.9
    assert cached() == 1
    clock[0] += 0.1
    assert cached() == 2 and calls == [(1, 2), (1, 2)]
