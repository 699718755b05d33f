"""The agent's ledger with real task processes: a launch applied once per attempt however often it arrives (also by
the agent's next life), exits kept until acknowledged, a kill that overtook its launch, and one event clock."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from contracts.task_messages import KillOrder, TaskEventKind
from tests.support.processes import wait_until
from tests.worker_agent.recording import Recorder
from tests.worker_agent.supervision.specs import spec_for
from worker_agent.supervision import Supervisor, ledger
from worker_agent.supervision.ledger import Ledger


def test_a_launch_sent_again_runs_once_even_after_the_agent_restarts(supervisor, sent, shared):
    marker = shared / "runs"
    spec = spec_for("once.py", str(marker))

    supervisor.launch(spec)
    supervisor.launch(spec)  # the orchestrator resent it (it had not heard STARTED yet)
    sent.wait_for(spec.task_id, TaskEventKind.EXITED)
    supervisor.launch(spec)  # a late duplicate, after the exit

    successor = Supervisor(Recorder(), supervisor.workdir)  # the agent's next life, same workdir
    successor.reclaim()
    successor.launch(spec)

    assert marker.read_text().count("ran") == 1
    assert len(sent.events(spec.task_id, TaskEventKind.STARTED)) == 1
    assert successor.running() == []


def test_an_exit_rides_on_every_report_until_acknowledged_and_survives_a_restart(supervisor, sent, shared):
    spec = spec_for("once.py", str(shared / "runs"))
    supervisor.launch(spec)
    event = sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    (recorded,) = supervisor.report().exits
    assert (recorded.task_id, recorded.attempt, recorded.exit_code, recorded.seq) == (
        spec.task_id, spec.attempt, 0, event["seq"]
    )  # fmt: skip
    assert supervisor.report().running == []
    assert supervisor.report().events_upto >= event["seq"]

    successor = Supervisor(Recorder(), supervisor.workdir)
    successor.reclaim()
    assert successor.report().exits == [recorded]  # the next life still has it

    successor.acknowledge_exits([(spec.task_id, spec.attempt)])
    assert successor.report().exits == []
    assert Supervisor(Recorder(), supervisor.workdir).report().exits == []


def test_a_running_task_is_listed_until_its_exit_is_recorded(supervisor, sent):
    spec = spec_for("stubborn.py")
    supervisor.launch(spec)
    started = sent.wait_for(spec.task_id, TaskEventKind.STARTED)

    report = supervisor.report()
    assert [(r.task_id, r.pid) for r in report.running] == [(spec.task_id, started["pid"])]
    assert report.events_upto >= started["seq"]
    assert report.exits == []

    supervisor.kill(KillOrder(job_id=spec.job_id, task_id=spec.task_id, attempt=spec.attempt))
    sent.wait_for(spec.task_id, TaskEventKind.EXITED)
    report = supervisor.report()
    assert report.running == [] and [e.task_id for e in report.exits] == [spec.task_id]


def test_a_kill_that_overtook_its_launch_ends_the_attempt_and_the_launch_never_runs(supervisor, sent, shared):
    marker = shared / "runs"
    spec = spec_for("once.py", str(marker))

    supervisor.kill(KillOrder(job_id=spec.job_id, task_id=spec.task_id, attempt=spec.attempt, reason="cancelled"))
    supervisor.launch(spec)

    exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED)
    assert exited["exit_code"] is None and exited["detail"] == "killed before it started"
    assert [e.task_id for e in supervisor.report().exits] == [spec.task_id]
    assert sent.events(spec.task_id, TaskEventKind.STARTED) == []
    assert not marker.exists()


def test_an_attempt_taken_but_never_started_is_reported_lost_by_the_next_life(tmp_path):
    workdir = tmp_path / "agent"
    Ledger(workdir).accept(7, 41, 1)  # the agent died between taking the order and starting the process

    successor = Supervisor(Recorder(), workdir)
    successor.reclaim()

    (lost,) = successor.report().exits
    assert (lost.task_id, lost.lost) == (41, True)
    assert "before the task's process started" in lost.detail


def test_a_refused_launch_is_judged_again_when_sent_again(supervisor, sent, shared):
    spec = spec_for("once.py", str(shared / "runs"))
    bad = replace(spec, program=replace(spec.program, script_sha256="0" * 64))  # content and hash disagree

    supervisor.launch(bad)
    sent.wait_for(spec.task_id, TaskEventKind.LAUNCH_FAILED)
    supervisor.launch(spec)

    assert sent.wait_for(spec.task_id, TaskEventKind.EXITED)["exit_code"] == 0


def test_the_event_clock_only_grows_across_lives(tmp_path):
    first = Ledger(tmp_path)
    numbers = [first.next_seq() for _ in range(1000)]
    ended = first.record_exit(1, 2, 1, exit_code=0)
    assert numbers == sorted(set(numbers)) and ended.seq > numbers[-1]
    assert Ledger(tmp_path).next_seq() > ended.seq


def test_acknowledged_attempts_are_pruned_beyond_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger, "KEEP_ACKED", 3)
    book = Ledger(tmp_path)
    for task_id in range(1, 6):
        book.accept(7, task_id, 1)
        book.record_exit(7, task_id, 1, exit_code=0)
    book.acknowledge([(task_id, 1) for task_id in range(1, 6)])

    assert sorted(p.name for p in Path(book.folder).iterdir()) == ["3-1.json", "4-1.json", "5-1.json"]
    assert Ledger(tmp_path).accept(7, 1, 1)  # forgotten: a launch that old is not expected any more
    assert not Ledger(tmp_path).accept(7, 5, 1)


def test_unreadable_entries_are_dropped(tmp_path):
    folder = tmp_path / "ledger"
    folder.mkdir()
    (folder / "1-1.json").write_text("{half")
    (folder / "2-1.json").write_text('{"job_id": 1, "task_id": 2, "attempt": 1, "state": "bogus"}')
    (folder / ".entry.x.tmp").write_text("")

    book = Ledger(tmp_path)

    assert book.accept(1, 1, 1) and book.accept(1, 2, 1)
    wait_until(lambda: not (folder / ".entry.x.tmp").exists(), timeout=1, what="the temp file to go")
