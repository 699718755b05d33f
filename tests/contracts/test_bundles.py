"""contracts/bundles.py: a host's reports packed into as few sealed entries as fit the entry bound, in order."""

import json

from contracts.bundles import HOST_REPORTS, MAX_BUNDLE_CHARS, MAX_BUNDLE_REPORTS, bundle_entries
from contracts.protocol import HOST_SAMPLES, TASK_LOGS, TASK_METRICS
from contracts.signing import agent_mac_key, open_sealed, seal

KEY = agent_mac_key("t" * 43, "gpu-1")


def sealer(name, body):
    return seal(KEY, "gpu-1", name, body)


def unpacked(entries):
    """(name, body) of every report the entries carry, in order; each entry's MAC checked."""
    out = []
    for entry in entries:
        opened = open_sealed(json.loads(entry["envelope"]), KEY, entry["name"], max_age_s=60)
        out += opened.body["reports"] if entry["name"] == HOST_REPORTS else [[entry["name"], opened.body]]
    return [(name, body) for name, body in out]


def test_reports_waiting_together_go_as_one_sealed_entry_in_order():
    reports = [(TASK_METRICS, {"n": 0}), (TASK_LOGS, {"n": 1}), (HOST_SAMPLES, {"n": 2}), (TASK_METRICS, {"n": 3})]
    entries = bundle_entries(reports, sealer)
    assert [entry["name"] for entry in entries] == [HOST_REPORTS]
    assert unpacked(entries) == reports


def test_a_lone_report_goes_as_itself():
    entries = bundle_entries([(TASK_METRICS, {"n": 0})], sealer)
    assert [entry["name"] for entry in entries] == [TASK_METRICS]


def test_too_much_for_one_entry_is_split_until_every_part_fits():
    big = "x" * 200_000
    reports = [(TASK_LOGS, {"n": n, "text": big}) for n in range(12)]  # ~2.4 MB in all
    entries = bundle_entries(reports, sealer)
    assert len(entries) > 2
    assert all(len(entry["envelope"]) <= MAX_BUNDLE_CHARS for entry in entries)
    assert unpacked(entries) == reports

    many = [(TASK_METRICS, {"n": n}) for n in range(MAX_BUNDLE_REPORTS + 1)]
    assert unpacked(bundle_entries(many, sealer)) == many


def test_a_body_that_cannot_be_sealed_is_left_out_alone():
    def strict(name, body):
        try:
            return sealer(name, body)
        except (TypeError, ValueError):
            return None

    reports = [(TASK_METRICS, {"n": 0}), (TASK_METRICS, {"bad": {1, 2}}), (TASK_METRICS, {"n": 2})]
    assert unpacked(bundle_entries(reports, strict)) == [reports[0], reports[2]]
