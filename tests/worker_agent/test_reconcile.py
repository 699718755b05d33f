"""Reclaiming on start: records of started tasks on disk, the pid-reuse guard, killing what a dead agent left."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from contracts import broker
from contracts.host_reports import HostFacts, RecordedExit, RunningTask, TaskReport, parse_task_report
from contracts.protocol import AGENT_HEARTBEAT, AGENT_HELLO
from contracts.signing import agent_mac_key, open_sealed
from contracts.task_messages import KillOrder, TaskEventKind
from tests.support.processes import gone, wait_until
from tests.worker_agent.recording import Recorder
from tests.worker_agent.supervision.specs import PROGRAMS, spec_for
from worker_agent.heartbeat import Heartbeat
from worker_agent.supervision import Supervisor
from worker_agent.supervision.records import ReclaimedTask, TaskRecord, TaskRecords, reclaim


def read_pids(pidfile: Path) -> list[int]:
    text = wait_until(lambda: pidfile.exists() and pidfile.read_text(), timeout=15, what="the pid file")
    return [int(p) for p in text.split()]


def orphan_tree(
    tmp_path: Path, *, task_id: int, exit_leader: bool = False
) -> tuple[subprocess.Popen[bytes], list[int]]:
    """A task-like tree (leader + grandchild, SIGTERM ignored) in its own session, as a supervisor starts one."""
    pidfile = tmp_path / f"pids-{task_id}"
    env = {**os.environ, "TFDASH_TASK_ID": str(task_id), "TFDASH_ATTEMPT": "1"}
    argv = [sys.executable, str(PROGRAMS / "stubborn.py"), "--pidfile", str(pidfile)]
    proc = subprocess.Popen([*argv, "--exit"] if exit_leader else argv, env=env, start_new_session=True)
    return proc, read_pids(pidfile)


def record_of(pid: int, *, task_id: int, create_time: float | None = None) -> TaskRecord:
    started = psutil.Process(pid).create_time() if create_time is None else create_time
    return TaskRecord(job_id=7, task_id=task_id, attempt=1, pid=pid, pgid=pid, create_time=started, started_at=0.0)


def write(records: TaskRecords, record: TaskRecord) -> None:
    records.folder.mkdir(parents=True, exist_ok=True)
    records.path(record.task_id, record.attempt).write_text(json.dumps(record.__dict__))


def kill_tree(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()


# --- the records ---------------------------------------------------------------------------------------------------
def test_it_records_a_started_task_on_disk_and_removes_it_once_the_exit_is_reported(supervisor, sent):
    spec = spec_for("stubborn.py")

    supervisor.launch(spec)
    started = sent.wait_for(spec.task_id, TaskEventKind.STARTED)

    path = supervisor.records.path(spec.task_id, spec.attempt)
    record = json.loads(path.read_text())  # written before STARTED went out
    assert record["pid"] == record["pgid"] == started["pid"]
    assert record["create_time"] == psutil.Process(started["pid"]).create_time()
    assert (record["job_id"], record["task_id"], record["attempt"]) == (spec.job_id, spec.task_id, spec.attempt)

    supervisor.kill(KillOrder(job_id=spec.job_id, task_id=spec.task_id, attempt=spec.attempt))
    sent.wait_for(spec.task_id, TaskEventKind.EXITED)
    wait_until(lambda: not path.exists(), timeout=5, what="the record to be removed")
    assert supervisor.records.load() == []


def test_it_drops_unreadable_records_and_temp_leftovers(tmp_path):
    records = TaskRecords(tmp_path)
    records.folder.mkdir()
    (records.folder / "5-1.json").write_text("{not json")
    (records.folder / "6-1.json").write_text(json.dumps({"task_id": "six"}))
    (records.folder / ".record.abc.tmp").write_text("half")

    assert records.load() == []
    assert list(records.folder.iterdir()) == []


# --- reclaiming ----------------------------------------------------------------------------------------------------
def test_a_new_supervisor_kills_what_a_dead_one_left_running_and_reports_it(supervisor, sent, shared):
    pidfile = shared / "pids"
    spec = spec_for("stubborn.py", "--pidfile", str(pidfile))
    supervisor.launch(spec)
    leader, grandchild = read_pids(pidfile)

    # The agent restarts with the same workdir; the old supervisor object stands for the dead agent's orphans.
    successor = Supervisor(Recorder(), supervisor.workdir)
    reclaimed = successor.reclaim()

    assert reclaimed == [
        ReclaimedTask(
            job_id=spec.job_id,
            task_id=spec.task_id,
            attempt=spec.attempt,
            pid=leader,
            detail=f"the agent restarted; its process (pid {leader}) was still running and was killed",
        )
    ]
    assert gone(leader) and gone(grandchild)  # the whole group, with SIGKILL (both ignore SIGTERM)
    assert successor.records.load() == []
    assert successor.running() == []
    # The new life reports it as a lost exit on every beat until the orchestrator acknowledges it.
    report = successor.report()
    assert report.running == []
    (lost,) = report.exits
    assert (lost.task_id, lost.attempt, lost.pid, lost.lost, lost.exit_code) == (
        spec.task_id, spec.attempt, leader, True, None
    )  # fmt: skip
    assert lost.detail == reclaimed[0].detail


def test_it_leaves_alone_a_process_that_got_a_recorded_pid_later(tmp_path):
    records = TaskRecords(tmp_path)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        # Same pid (and group id) as the record, but it started at another time: the task's process is long gone.
        started = psutil.Process(stranger.pid).create_time()
        write(records, record_of(stranger.pid, task_id=41, create_time=started - 100))

        (reclaimed,) = reclaim(records)

        assert stranger.poll() is None
        assert psutil.Process(stranger.pid).status() != psutil.STATUS_ZOMBIE
        assert reclaimed.task_id == 41
        assert reclaimed.detail == f"the agent restarted; its process (pid {stranger.pid}) had ended meanwhile " + (
            "(exit code unknown)"
        )
        assert records.load() == []
    finally:
        stranger.kill()
        stranger.wait()


def test_when_the_leader_is_gone_it_kills_only_group_members_that_carry_the_tasks_identity(tmp_path):
    records = TaskRecords(tmp_path)
    ours, (ours_leader, ours_grandchild) = orphan_tree(tmp_path, task_id=51, exit_leader=True)
    theirs, (theirs_leader, theirs_grandchild) = orphan_tree(tmp_path, task_id=99, exit_leader=True)
    try:
        ours.wait(15)
        theirs.wait(15)
        write(records, record_of(ours_leader, task_id=51, create_time=_start_time_before(ours_grandchild)))
        # A record whose group now holds a process of another task: never proven to be ours.
        write(records, record_of(theirs_leader, task_id=52, create_time=_start_time_before(theirs_grandchild)))

        reclaimed = {r.task_id: r.detail for r in reclaim(records)}

        assert gone(ours_grandchild)
        assert "was still running and was killed" in reclaimed[51]
        assert not gone(theirs_grandchild)
        assert "had ended meanwhile" in reclaimed[52]
    finally:
        kill_tree([ours_grandchild, theirs_grandchild])


def _start_time_before(pid: int) -> float:
    # The leader is reaped already; it started just before its child.
    return psutil.Process(pid).create_time() - 0.5


def test_reclaiming_with_no_records_does_nothing(tmp_path):
    assert reclaim(TaskRecords(tmp_path / "never-used")) == []


# --- the hello -----------------------------------------------------------------------------------------------------
class _Broker:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    def xadd(self, stream: str, fields: dict, **_: object) -> None:
        # The hello on the host's events stream, a heartbeat on its heartbeats stream.
        kind = broker.EVENTS if fields["name"] == AGENT_HELLO else broker.HEARTBEATS
        assert stream == broker.stream("h", kind)
        self.sent.append((fields["name"], json.loads(fields["envelope"])))


KEY = agent_mac_key("tfa_t", "h")


def test_every_report_carries_the_task_report_and_it_survives_the_wire():
    report = TaskReport(
        running=[RunningTask(job_id=1, task_id=2, attempt=1, pid=321)],
        exits=[RecordedExit(job_id=1, task_id=3, attempt=1, seq=17, pid=99, exit_code=-9, detail="killed")],
        events_upto=18,
    )
    wire = _Broker()
    beat = Heartbeat(
        wire,  # type: ignore[arg-type]
        host="h",
        key=KEY,
        interval_s=1,
        facts=lambda: HostFacts(cpu_count=1, memory_total_mb=1),
        tasks=lambda: report,
        stream=wire,  # type: ignore[arg-type]
    )

    beat.send(AGENT_HELLO)
    beat.send(AGENT_HEARTBEAT)

    (hello_name, hello), (beat_name, heartbeat) = wire.sent
    assert (hello_name, beat_name) == (AGENT_HELLO, AGENT_HEARTBEAT)
    hello_body = open_sealed(json.loads(json.dumps(hello)), KEY, AGENT_HELLO, max_age_s=60).body
    beat_body = open_sealed(json.loads(json.dumps(heartbeat)), KEY, AGENT_HEARTBEAT, max_age_s=60).body
    assert parse_task_report(hello_body["tasks"]) == report
    assert parse_task_report(beat_body["tasks"]) == report
    assert parse_task_report(None) is None
