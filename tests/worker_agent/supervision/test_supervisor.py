"""The supervisor against real child processes: start, numbered output, exit, kills."""

from __future__ import annotations

import logging
import signal
import time

import pytest

from contracts.protocol import TASK_EVENT, TASK_LOGS
from contracts.task_messages import KillOrder, TaskEventKind
from tests.support.processes import gone, wait_until
from tests.worker_agent.recording import Recorder
from tests.worker_agent.supervision.specs import spec_for


# --- start, output, exit --------------------------------------------------------------------------------------------
def test_it_reports_start_then_numbered_logs_then_the_exit_code(supervisor, sent):
    spec = spec_for("chatty.py", "3")

    supervisor.launch(spec)
    exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    messages = sent.of(spec.task_id)
    assert messages[0][0] == TASK_EVENT and messages[0][1]["kind"] == TaskEventKind.STARTED
    assert messages[-1] == (TASK_EVENT, exited)
    assert messages[0][1]["pid"] == exited["pid"] > 0
    assert exited["exit_code"] == 3 and exited["detail"] == ""
    assert [name for name, _ in messages[1:-1]] == [TASK_LOGS] * (len(messages) - 2)  # every log before EXITED
    lines = sent.lines(spec.task_id)
    assert [seq for seq, _, _ in lines] == list(range(len(lines)))
    stdout = sent.texts(spec.task_id)
    assert stdout == ["out-1", "out-2", "x" * 10_000, "caf\xe9 \u2713", "no newline at the end"]
    assert sent.texts(spec.task_id, "stderr") == ["err-1"]
    assert [text for _, _, text in supervisor.tail(spec.task_id)] == [text for _, _, text in lines]
    assert supervisor.running() == []


def test_it_batches_a_flood_of_lines_in_order(supervisor, sent):
    spec = spec_for("many_lines.py", "1000")

    supervisor.launch(spec)
    sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    batches = [b["lines"] for n, b in sent.of(spec.task_id) if n == TASK_LOGS]
    assert all(len(batch) <= 200 for batch in batches)
    assert sent.texts(spec.task_id) == [f"line {i}" for i in range(1000)]
    assert [seq for seq, _, _ in sent.lines(spec.task_id)] == list(range(1000))
    assert len(supervisor.tail(spec.task_id)) == 200


def test_it_lists_running_tasks_and_drops_a_second_launch_of_the_same_attempt(supervisor, sent, caplog):
    spec = spec_for("stubborn.py")
    supervisor.launch(spec)
    started = sent.wait_for(spec.task_id, TaskEventKind.STARTED)
    before = len(sent.of(spec.task_id))

    with caplog.at_level(logging.INFO, logger="worker_agent.supervision.task_start"):
        supervisor.launch(spec)  # sent again by the orchestrator, or redelivered: applied once

    assert "dropping a repeated launch" in caplog.text
    assert len(sent.of(spec.task_id)) == before
    assert supervisor.running() == [
        {"task_id": spec.task_id, "attempt": 0, "pid": started["pid"], "job_id": spec.job_id}
    ]


# --- killing --------------------------------------------------------------------------------------------------------
def started_pids(sent: Recorder, task_id: int) -> tuple[int, int]:
    line = wait_until(
        lambda: next((t for t in sent.texts(task_id) if t.startswith("pids ")), None), 15, what="the pids line"
    )
    child, grandchild = map(int, line.split()[1:])
    return child, grandchild


@pytest.mark.parametrize(("polite", "code"), [(False, -signal.SIGKILL), (True, -signal.SIGTERM)])
def test_kill_ends_the_task_and_its_grandchild_within_the_grace_period(supervisor, sent, polite, code):
    spec = spec_for("stubborn.py", *(["--polite"] if polite else []), kill_grace_s=1.0)
    supervisor.launch(spec)
    child, grandchild = started_pids(sent, spec.task_id)

    killed_at = time.monotonic()
    supervisor.kill(KillOrder(job_id=spec.job_id, task_id=spec.task_id, attempt=0, reason="job cancelled"))
    assert time.monotonic() - killed_at < 0.5  # the grace period is waited out elsewhere

    exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED, timeout=spec.kill_grace_s + 3)
    assert exited["exit_code"] == code
    assert exited["detail"] == "job cancelled"
    assert time.monotonic() - killed_at < spec.kill_grace_s + 3
    wait_until(lambda: gone(child) and gone(grandchild), timeout=3, what="child and grandchild to be gone")


def test_a_grandchild_does_not_outlive_a_task_that_exits_by_itself(supervisor, sent):
    spec = spec_for("stubborn.py", "--exit")
    supervisor.launch(spec)
    _, grandchild = started_pids(sent, spec.task_id)

    exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    assert exited["exit_code"] == 0 and exited["detail"] == ""
    wait_until(lambda: gone(grandchild), timeout=3, what="the grandchild to be gone")


def test_kill_of_an_attempt_that_already_ended_is_ignored(supervisor, sent):
    spec = spec_for("chatty.py", "0")
    supervisor.launch(spec)
    sent.wait_for(spec.task_id, TaskEventKind.EXITED)
    before = len(sent.of(spec.task_id))

    supervisor.kill(KillOrder(job_id=spec.job_id, task_id=spec.task_id, attempt=spec.attempt))

    assert len(sent.of(spec.task_id)) == before


def test_kill_all_kills_every_task_and_refuses_new_launches(supervisor, sent):
    specs = [spec_for("stubborn.py"), spec_for("stubborn.py")]
    for spec in specs:
        supervisor.launch(spec)
    pids = [started_pids(sent, spec.task_id) for spec in specs]

    supervisor.kill_all("agent shutting down", timeout=10)

    for spec in specs:  # kill_all returns only once every EXITED has been handed on
        [exited] = sent.events(spec.task_id, TaskEventKind.EXITED)
        assert exited["exit_code"] == -signal.SIGKILL and exited["detail"] == "agent shutting down"
    # SIGKILL takes effect asynchronously: a reparented grandchild may take a moment to be gone.
    wait_until(lambda: all(gone(pid) for pair in pids for pid in pair), timeout=3, what="every task process to be gone")
    assert supervisor.running() == []
    late = spec_for("chatty.py", "0")
    supervisor.launch(late)
    assert sent.events(late.task_id)[0]["detail"] == "the agent is shutting down"
