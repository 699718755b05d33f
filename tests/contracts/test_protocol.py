"""Facts from the wire are rebuilt strictly: malformed payloads raise instead of reaching the database."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from contracts.host_reports import parse_facts
from worker_agent import facts


def test_it_round_trips_the_facts_an_agent_collects():
    collected = facts.collect((23000, 23099))

    assert parse_facts(asdict(collected)) == collected


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"cpu_count": "many", "memory_total_mb": 1},
        {"cpu_count": 1, "memory_total_mb": 1, "gpus": [{"index": 0}]},
        {"cpu_count": 2**31, "memory_total_mb": 1},  # a host lying its way into every placement
        {"cpu_count": 0, "memory_total_mb": 1},
        {"cpu_count": 2, "memory_total_mb": 1, "gpus": [{"index": 0, "name": "g", "memory_total_mb": 1}] * 10**6},
        {"cpu_count": 2, "memory_total_mb": 10**30},
        {"cpu_count": 2, "memory_total_mb": 1, "pid": -1},
    ],
    ids=["empty", "text", "gpu without fields", "2**31 CPUs", "no CPU", "10**6 GPUs", "10**30 MB", "negative pid"],
)
def test_it_rejects_malformed_facts(raw):
    with pytest.raises(ValueError, match="malformed host facts"):
        parse_facts(raw)
