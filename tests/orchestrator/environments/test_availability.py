"""Which hosts can run an environment, from what their agents reported: one rule for placement, submission and the
host page (orchestrator/environments/availability.py), plain Python."""

from __future__ import annotations

from orchestrator.environments import availability

OK = {"name": "main", "interpreter": "/opt/tf/bin/python", "ok": True, "tensorflow": "2.17.0", "gpu_reason": ""}


def test_a_host_whose_probe_is_ok_for_the_registered_interpreter_can_run_it() -> None:
    assert availability.usable([OK], {"main": "/opt/tf/bin/python"}, has_gpus=False) == {"main"}
    assert availability.labels([OK], {"main": "/opt/tf/bin/python"}, has_gpus=False) == {"env:main"}


def test_not_probed_failed_or_probed_with_another_interpreter_cannot() -> None:
    registered = {"main": "/opt/tf/bin/python"}
    assert "not probed yet" in availability.why_not(None, "/opt/tf/bin/python", False)
    assert "registered now" in availability.why_not({**OK, "interpreter": "/old"}, "/opt/tf/bin/python", False)
    failed = {**OK, "ok": False, "error": "No module named tensorflow"}
    assert "No module named tensorflow" in availability.why_not(failed, "/opt/tf/bin/python", False)
    assert availability.usable([failed], registered, False) == frozenset()
    assert availability.usable("junk", registered, False) == frozenset()


def test_a_gpu_reason_matters_only_on_a_host_with_gpus() -> None:
    flagged = {**OK, "gpu_reason": "built without CUDA"}
    assert availability.why_not(flagged, "/opt/tf/bin/python", has_gpus=False) == ""
    assert "cannot use the host's GPUs: built without CUDA" in availability.why_not(flagged, "/opt/tf/bin/python", True)


def test_a_refusal_names_every_host_and_why() -> None:
    hosts = [("a", [], False), ("b", [{**OK, "ok": False, "error": "boom"}], False)]
    said = availability.hosts_problem("main", "/opt/tf/bin/python", hosts, "lab")
    assert said.startswith("no host of cluster lab can run environment main: a: not probed yet")
    assert "b: its probe failed: boom" in said
    assert availability.hosts_problem("main", "/opt/tf/bin/python", [*hosts, ("c", [OK], False)], "lab") == ""
