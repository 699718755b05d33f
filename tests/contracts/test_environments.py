"""The task environment rules both sides apply: names, interpreters, the agent's list, a job's requirements file, and
the bounded parsing of what a host reports."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from contracts import environments as rules
from contracts.host_reports import EnvironmentFacts, HostFacts, parse_facts
from contracts.task_messages import launch_body_for


@pytest.mark.parametrize("name", ["tf-2.17-cuda12", "main", "a", "tf_2.15"])
def test_it_accepts_names_by_the_rule(name: str) -> None:
    assert rules.name_problem(name) == ""


@pytest.mark.parametrize("name", ["", "Main", "-x", "a b", "env:x", "x" * 64, None, 3])
def test_it_refuses_other_names(name: object) -> None:
    assert rules.name_problem(name)


@pytest.mark.parametrize("path", ["relative/python", "/opt/../etc/python", "/opt/env/", "/a\x00b", "", "/a\nb"])
def test_it_refuses_an_interpreter_that_is_no_plain_absolute_path(path: str) -> None:
    assert rules.interpreter_problem(path)


def test_an_environment_list_round_trips_and_junk_is_refused() -> None:
    envs = [rules.Environment("main", "/opt/tf/bin/python"), rules.Environment("old", "/opt/tf215/bin/python3")]
    assert rules.environments_from(rules.environments_body(envs)) == envs
    too_many = [{"name": "a", "interpreter": f"/p{i}"} for i in range(rules.MAX_ENVIRONMENTS + 1)]
    twice = [{"name": "a", "interpreter": "/p"}] * 2
    for junk in ({}, {"environments": "x"}, {"environments": [{"name": "a"}]}, {"environments": twice},
                 {"environments": too_many}):  # fmt: skip
        with pytest.raises(ValueError):
            rules.environments_from(junk)


def test_a_requirements_file_holds_requirement_lines_only() -> None:
    ok = "# pinned\nscikit-learn==1.5.2\nrich[jupyter]>=13,<14  # a comment\n\ntabulate\n"
    assert rules.requirements_problems(ok) == []
    assert rules.normalized_requirements(ok) == "scikit-learn==1.5.2\nrich[jupyter]>=13,<14\ntabulate\n"
    for bad, said in [
        ("-e .", "pip options (-e)"),
        ("--index-url https://example.invalid/simple", "pip options (--index-url)"),
        ("-f /tmp/wheels", "pip options (-f)"),
        ("-r other.txt", "pip options (-r)"),
        ("./local/package", "not a plain requirement"),
        ("/abs/path.whl", "not a plain requirement"),
        ("pkg @ https://example.invalid/pkg.whl", "not a plain requirement"),
        ("git+https://example.invalid/repo", "not a plain requirement"),
        ('pkg; python_version < "3.9"', "not a plain requirement"),
    ]:
        problems = rules.requirements_problems(f"tabulate\n{bad}\n")
        assert problems and problems[0].startswith("line 2: ") and said in problems[0], (bad, problems)
    assert "larger than 64 KiB" in rules.requirements_problems("a\n" * 40_000)[0]


def test_host_facts_carry_environments_bounded() -> None:
    env = EnvironmentFacts("main", "/opt/tf/bin/python", True, "3.11.9", "2.17.0", "3.5.0", 0, "", "")
    facts = HostFacts(cpu_count=4, memory_total_mb=1000, environments=[env])
    assert parse_facts(asdict(facts)).environments == [env]
    raw = asdict(facts)
    raw["environments"][0]["error"] = "x" * 100_000
    assert len(parse_facts(raw).environments[0].error) == 1000
    too_many = [{"name": f"e{i}", "ok": True} for i in range(33)]
    for junk in ([{"name": "BAD", "ok": True}], [{"name": "a", "ok": "yes"}], ["x"], "x",
                 [{"name": "a", "ok": True, "gpus_visible": 10**6}], too_many):  # fmt: skip
        with pytest.raises(ValueError):
            parse_facts({**asdict(facts), "environments": junk})


def test_a_previous_agent_gets_no_environment_keys() -> None:
    body = {"job_id": 1, "environment": "main", "interpreter": "/p", "requirements": "tabulate\n"}
    assert launch_body_for(body, 3) == {"job_id": 1}
    assert launch_body_for(body, 4) == body
