"""The table's own promises: every kind has a rule, the last rule catches every failure, every template can be filled
from the facts classify.py gathers and the rule's own named groups, and the rows no real script in the suite reaches
(what the orchestrator or an agent says of a task's end) still decide their kind."""

from __future__ import annotations

import re
import string
from datetime import timedelta

import pytest

from orchestrator.diagnosis.classify import JobEnd, _facts, classify
from orchestrator.diagnosis.rules import KINDS, RULES, TASK_RULES
from tests.orchestrator.diagnosis.corpus import T0, task_end


def test_every_kind_has_a_rule_and_the_last_rule_catches_everything():
    assert {rule.kind for rule in RULES} == set(KINDS)
    last = TASK_RULES[-1]
    assert last.kind == "unknown" and not last.compiled and not last.exit_codes and not last.task_states


@pytest.mark.parametrize("rule", RULES, ids=[f"{i}-{rule.kind}" for i, rule in enumerate(RULES)])
def test_every_template_is_filled_by_the_facts_and_the_rules_own_groups(rule):
    named = set(_facts(task_end(1, []), JobEnd("failed", "", "mirrored")))
    for pattern in rule.compiled.values():
        named |= set(pattern.groupindex)
    for template in (rule.title, rule.message, rule.hint):
        fields = {field for _, field, _, _ in string.Formatter().parse(template) if field}
        assert fields <= named, (rule.kind, template, fields - named)


def test_what_the_orchestrator_says_of_a_task_decides_its_kind():
    job = JobEnd("failed", "worker 0 on host-a could not start: port 27100 was taken", "multi_worker_mirrored")
    taken = classify(job, [task_end(None, [], detail="port 27100 was taken: [Errno 98] Address already in use")])
    assert (taken["kind"], taken["task"]) == ("port_taken", "worker 0 on host-a")

    # The agent's evidence (worker_agent/supervision/oom_evidence.py, from the kernel's log) is quoted.
    evidence = "oom-kill: the kernel killed process 16308 (python3) for lack of the host's memory (total-vm:1kB, x)"
    oom = task_end(-9, ["epoch 3/10"], detail=evidence)
    verdict = classify(JobEnd("failed", "worker 0 on host-a was killed by signal 9", "mirrored"), [oom])
    assert verdict["kind"] == "host_oom" and evidence in verdict["message"]

    # A SIGKILL the product sent (its kill reason is the detail) is no out-of-memory.
    ours = task_end(-9, ["epoch 3/10"], detail="job failed")
    assert (
        classify(JobEnd("failed", "worker 0 on host-a was killed by signal 9", "mirrored"), [ours])["kind"] == "unknown"
    )


def test_a_gang_that_never_connected_names_the_task_the_reason_names_first():
    waiting = task_end(None, ["waiting for a peer"], label="worker 1 on host-b", index=1, state="killed")
    job = JobEnd("failed", "not all tasks running and connected within 10 s: worker 1 on host-b is started but not "
                 "listening on port 27001", "multi_worker_mirrored", failed_task_id=waiting.id)  # fmt: skip

    verdict = classify(job, [task_end(None, [], state="killed"), waiting])

    assert (verdict["kind"], verdict["task"]) == ("never_connected", "worker 1 on host-b")
    assert verdict["title"] == "worker 1 on host-b never connected"
    assert re.search(r"within 10 s: worker 1 on host-b is started", verdict["message"])


def test_a_hung_parameter_server_job_names_its_chief_since_its_servers_never_report():
    ps = task_end(-9, ["ps 0: serving"], label="ps 0 on host-a", task_type="ps", state="killed")
    chief = task_end(-9, ["step 40"], label="chief 0 on host-b", task_type="chief", state="killed")
    ps = type(ps)(**{**ps.__dict__, "last_seen": T0})
    chief = type(chief)(**{**chief.__dict__, "last_seen": T0 + timedelta(minutes=5)})

    verdict = classify(
        JobEnd("failed", "no progress for 300 s (no metric point or log line)", "parameter_server"), [ps, chief]
    )

    assert (verdict["kind"], verdict["task"]) == ("hang", "chief 0 on host-b")


def test_a_parameter_server_save_under_tmp_is_found_below_a_long_graph_execution_traceback():
    # As the chief of tests/programs/ps_tutorial.py printed it in one of its real runs (its other runs print the
    # status line as "(0) NOT_FOUND: <path>"): the exception's name ~150 lines above the path, out of the tail.
    frames = ['  File "/venv/lib/python3.11/site-packages/tf_keras/src/callbacks.py", line 456, in on_epoch_end', ""]
    lines = [
        *frames * 80,
        '  File "/jobs/1/chief-0-a1/b02585.py", line 55, in <module>',
        "",
        "/tmp/my_working_dir/ckpt/variables/variables_temp; No such file or directory",
        "\t [[{{node SaveV2}}]]",
    ]
    chief = task_end(1, lines, label="chief 0 on host-a", task_type="chief")
    job = JobEnd("failed", "chief 0 on host-a exited with code 1", "parameter_server", script_file="b02585.py",
                 script_name="ps_tutorial.py")  # fmt: skip

    verdict = classify(job, [chief])

    assert verdict["kind"] == "non_shared_path"
    assert verdict["message"].startswith(
        "chief 0 on host-a saved the model to /tmp/my_working_dir/ckpt at ps_tutorial.py:55"
    )
    assert verdict["hint"].startswith("Save under $TFDASH_JOB_DIR")
