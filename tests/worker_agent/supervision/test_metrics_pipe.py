"""The metrics pipe against real child processes: plain Python scripts that write JSON lines to TFDASH_METRICS_FD."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import logging
import os
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from contracts.limits import MAX_ARTIFACT_BYTES
from contracts.protocol import TASK_ARTIFACT, TASK_EVENT, TASK_METRICS
from contracts.task_messages import LaunchSpec, ProgramSpec, TaskEventKind
from contracts.task_wire import JOB_DIR_ENV, METRICS_FD_ENV
from tests.support.processes import gone, wait_until
from tests.worker_agent.recording import Recorder
from worker_agent.folders import Roots
from worker_agent.supervision import programs, task_run
from worker_agent.supervision.task_run import READER_JOIN_S

_task_ids = itertools.count(5000)

# Every script starts with this: `emit(obj)` writes one JSON line, `raw(bytes)` writes bytes as they are.
PRELUDE = """\
import json, os, subprocess, sys, time
FD = int(os.environ["TFDASH_METRICS_FD"])
metrics = open(FD, "w", buffering=1, closefd=False)
def emit(obj):
    metrics.write(json.dumps(obj) + "\\n")
def raw(data):
    os.write(FD, data)
"""


def script_spec(source: str, *args: str, **changes: Any) -> LaunchSpec:
    content = (PRELUDE + textwrap.dedent(source)).encode()
    fields: dict[str, Any] = {
        "job_id": 11,
        "task_id": next(_task_ids),
        "attempt": 3,
        "task_type": "worker",
        "task_index": 0,
        "port": None,
        "devices": [0],
        "gpu": False,
        "env": {},
        "program": ProgramSpec(
            kind="script",
            script_b64=base64.b64encode(content).decode(),
            script_sha256=hashlib.sha256(content).hexdigest(),
            args=list(args),
        ),
        "kill_grace_s": 1.0,
    }
    return LaunchSpec(**{**fields, **changes})


def batches(sent: Recorder, task_id: int) -> list[dict[str, Any]]:
    return [body for name, body in sent.of(task_id) if name == TASK_METRICS]


def events(sent: Recorder, task_id: int) -> list[dict[str, Any]]:
    return [event for batch in batches(sent, task_id) for event in batch["events"]]


def artifacts(sent: Recorder, task_id: int) -> list[dict[str, Any]]:
    return [body for name, body in sent.of(task_id) if name == TASK_ARTIFACT]


def kinds(sent: Recorder, task_id: int) -> list[str]:
    """The message sequence as names, events by their kind: e.g. ["started", TASK_METRICS, ..., "exited"]."""
    return [body["kind"] if name == TASK_EVENT else name for name, body in sent.of(task_id)]


def metric(step: int, **values: float) -> dict[str, Any]:
    return {"kind": "metric", "ts": 1.0, "step": step, "epoch": None, "phase": "train", "metrics": values}


# --- metrics and facts ----------------------------------------------------------------------------------------------
def test_metric_and_facts_lines_arrive_batched_in_order_and_before_the_exit(supervisor, sent):
    spec = script_spec("""
        emit({"kind": "facts", "ts": 1.0, "facts": {"replicas_in_sync": 2, "global_batch": 64}})
        for step in range(1000):
            emit({"kind": "metric", "ts": 1.0, "step": step, "epoch": None, "phase": "train",
                  "metrics": {"loss": 1.0 / (step + 1)}})
        emit({"kind": "metric", "ts": 2.0, "step": 1000, "epoch": 0, "phase": "epoch_end",
              "metrics": {"loss": 0.001, "val_loss": 0.002}})
    """)

    supervisor.launch(spec)
    exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    assert exited["exit_code"] == 0
    got = events(sent, spec.task_id)
    assert got[0] == {"kind": "facts", "ts": 1.0, "facts": {"replicas_in_sync": 2, "global_batch": 64}}
    assert [e["step"] for e in got[1:]] == list(range(1001))
    assert got[-1]["phase"] == "epoch_end" and got[-1]["metrics"] == {"loss": 0.001, "val_loss": 0.002}
    sent_batches = batches(sent, spec.task_id)
    assert all((b["task_id"], b["attempt"]) == (spec.task_id, 3) for b in sent_batches)
    assert all(1 <= len(b["events"]) <= 500 for b in sent_batches)
    # Batched: fewer messages than lines. How few depends on how busy the machine is (a handful when quiet, 250 seen
    # under load), so the contract asserted is batching itself, never a count.
    assert len(sent_batches) < len(got)
    sequence = [k for k in kinds(sent, spec.task_id) if k != "orchestrator.task_logs"]
    assert sequence == [TaskEventKind.STARTED, *[TASK_METRICS] * len(sent_batches), TaskEventKind.EXITED]


def test_metrics_of_a_running_task_go_out_within_the_flush_period(supervisor, sent):
    spec = script_spec("""
        emit({"kind": "metric", "ts": 1.0, "step": 1, "epoch": 0, "phase": "train", "metrics": {"loss": 0.5}})
        time.sleep(3600)
    """)

    supervisor.launch(spec)
    # The script sleeps for an hour after its line: only the 0.2 s flush clock can send it meanwhile.
    wait_until(lambda: events(sent, spec.task_id), timeout=5, interval=0.01, what="the first metric")

    assert supervisor.running() != []
    assert events(sent, spec.task_id)[0]["metrics"] == {"loss": 0.5}


def test_malformed_lines_are_dropped_and_the_good_ones_around_them_arrive(supervisor, sent, caplog):
    spec = script_spec("""
        emit({"kind": "metric", "step": 1})
        raw(b"not json at all\\n")
        raw(b"[1, 2, 3]\\n")
        raw(b'"a string"\\n')
        emit({"kind": "bogus", "step": 99})
        emit({"kind": 5})
        emit({"step": 98})
        raw(b"\\xff\\xfe{}\\n")
        raw(b"[" * 50000 + b"\\n")
        emit({"kind": "metric", "step": 97, "padding": "x" * 200_000})  # valid JSON, but over the 64 KiB cap
        raw(b"\\n")
        raw(b'{"kind": "metric", "metrics": {"loss": NaN}}\\n')  # Python reads these; JSON has no such numbers
        raw(b'{"kind": "metric", "metrics": {"loss": 1e999}}\\n')
        emit({"kind": "facts", "facts": {"step": 2}})
        emit({"kind": "metric", "step": 96, "padding": "y" * 70_000})
        raw(b'{"kind": "metric", "step": 3}')  # the last line has no newline: it still counts
    """)

    with caplog.at_level(logging.WARNING, logger="worker_agent.supervision.metrics_pipe"):
        supervisor.launch(spec)
        exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    assert exited["exit_code"] == 0, sent.lines(spec.task_id)
    assert events(sent, spec.task_id) == [
        {"kind": "metric", "step": 1},
        {"kind": "facts", "facts": {"step": 2}},
        {"kind": "metric", "step": 3},
    ]
    assert "dropped 1 metrics line(s) (1 in all)" in caplog.text  # the first one at once
    assert "(12 in all)" in caplog.text  # the rest counted, in one warning at the end (a blank line is no drop)
    assert len([r for r in caplog.records if "dropped" in r.getMessage()]) == 2


# --- artifacts ------------------------------------------------------------------------------------------------------
def test_an_artifact_arrives_with_its_content_after_the_metrics_written_before_it(supervisor, sent):
    spec = script_spec("""
        job_dir = os.environ["TFDASH_JOB_DIR"]
        path = os.path.join(job_dir, "model.keras")
        with open(path, "wb") as out:
            out.write(os.urandom(300_000))
        emit({"kind": "metric", "step": 1})
        emit({"kind": "artifact", "ts": 1.0, "name": "model.keras", "path": path})
        emit({"kind": "metric", "step": 2})
    """)

    supervisor.launch(spec)
    sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    [artifact] = artifacts(sent, spec.task_id)
    content = (programs.job_dir(spec, supervisor.workdir) / "model.keras").read_bytes()
    assert (artifact["task_id"], artifact["attempt"], artifact["name"]) == (spec.task_id, 3, "model.keras")
    assert artifact["sha256"] == hashlib.sha256(content).hexdigest()
    assert base64.b64decode(artifact["content_b64"]) == content
    sequence = [k for k in kinds(sent, spec.task_id) if k != "orchestrator.task_logs"]
    assert sequence == ["started", TASK_METRICS, TASK_ARTIFACT, TASK_METRICS, "exited"]
    assert [e["step"] for e in events(sent, spec.task_id)] == [1, 2]


def test_bad_artifacts_are_skipped_and_the_reader_goes_on(supervisor, sent, caplog):
    spec = script_spec(
        """
        job_dir = os.environ["TFDASH_JOB_DIR"]
        good = os.path.join(job_dir, "good.txt")
        with open(good, "w") as out:
            out.write("fine")
        big = os.path.join(job_dir, "big.bin")
        with open(big, "wb") as out:
            out.truncate(int(sys.argv[1]) + 1)  # sparse: one byte over the limit costs nothing
        fifo = os.path.join(job_dir, "fifo")
        os.mkfifo(fifo)
        for name, path in [
            ("dir", job_dir),
            ("a/b.txt", good),
            ("../good.txt", good),
            ("..", good),
            ("x" * 101, good),
            ("", good),
            (None, good),
            ("big.bin", big),
            ("fifo", fifo),  # opening it for reading must not wait for a writer
            ("missing.txt", os.path.join(job_dir, "missing.txt")),
            ("relative.txt", "good.txt"),
            ("nopath.txt", None),
        ]:
            emit({"kind": "artifact", "name": name, "path": path})
        emit({"kind": "artifact", "name": "good.txt", "path": good})
        """,
        str(MAX_ARTIFACT_BYTES),
    )

    with caplog.at_level(logging.WARNING, logger="worker_agent.supervision.metrics_pipe"):
        supervisor.launch(spec)
        exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    assert exited["exit_code"] == 0, sent.lines(spec.task_id)
    [artifact] = artifacts(sent, spec.task_id)
    assert artifact["name"] == "good.txt"
    assert base64.b64decode(artifact["content_b64"]) == b"fine"
    assert artifact["sha256"] == hashlib.sha256(b"fine").hexdigest()
    assert "(12 in all)" in caplog.text
    assert "not a regular file" in caplog.text  # the last reason named (the directory's was the first warning)


# --- environment ----------------------------------------------------------------------------------------------------
SHOW_ENV = """
    job_dir = os.environ.get("TFDASH_JOB_DIR")
    report = {"job_dir": job_dir, "exists": os.path.isdir(job_dir), "fd": os.environ["TFDASH_METRICS_FD"]}
    print(json.dumps({**report, "fd_is_a_pipe": __import__("stat").S_ISFIFO(os.fstat(FD).st_mode)}))
"""


@pytest.mark.parametrize("given", [True, False])
def test_the_task_gets_its_job_dir_and_metrics_fd(supervisor, sent, tmp_path, given):
    job_dir = tmp_path / "nfs" / "jobs" / "11"  # under the shared root, not there yet: the supervisor creates it
    spec = script_spec(SHOW_ENV, job_dir=str(job_dir) if given else "")

    supervisor.launch(spec)
    sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    report = json.loads(sent.texts(spec.task_id)[-1])
    expected = job_dir if given else tmp_path / "agent" / "jobs" / str(spec.job_id) / "shared"
    assert report["job_dir"] == str(expected) == str(programs.job_dir(spec, supervisor.workdir))
    assert report["exists"] and expected.is_dir()
    assert int(report["fd"]) > 2 and report["fd_is_a_pipe"]
    assert METRICS_FD_ENV == "TFDASH_METRICS_FD" and JOB_DIR_ENV == "TFDASH_JOB_DIR"


@pytest.mark.parametrize(
    ("job_dir", "why"),
    [
        ("relative/dir", "must be empty or an absolute path"),
        ("{outside}/jobs/11", "is not under"),  # signed or not, the agent's own roots bound what it acts on
        ("{nfs}/../outside/jobs/11", "contains '..'"),
        ("{nfs}/jobs/12", "is not under"),  # another job's folder
        ("{agent}/ledger", "is not under"),  # the agent's own state
        ("{nfs}", "is not under"),  # the whole shared folder
        ("{linked}/jobs/11", "is not a folder (a link or a file)"),  # a link below the root is never followed
    ],
)
def test_a_job_dir_outside_the_jobs_folders_is_refused_and_nothing_is_made_there(
    supervisor, sent, tmp_path, job_dir, why
):
    outside = tmp_path / "outside"
    outside.mkdir()
    linked = tmp_path / "linked"  # a second shared root, whose jobs/ a task swapped for a link
    linked.mkdir()
    (linked / "jobs").symlink_to(outside)
    supervisor.workspace.roots = Roots.agent(supervisor.workdir, [tmp_path / "nfs", linked])
    where = {"outside": outside, "nfs": tmp_path / "nfs", "agent": supervisor.workdir, "linked": linked}
    spec = script_spec(SHOW_ENV, job_dir=job_dir.format(**where))

    supervisor.launch(spec)

    [event] = sent.events(spec.task_id)
    assert event["kind"] == TaskEventKind.LAUNCH_FAILED
    assert "job_dir" in event["detail"] and why in event["detail"], event["detail"]
    assert list(outside.iterdir()) == []
    assert supervisor.report().running == []


# --- exits ----------------------------------------------------------------------------------------------------------
def test_a_task_that_never_writes_metrics_exits_promptly(supervisor, sent):
    spec = script_spec("""
        print("no metrics here")
        sys.exit(4)
    """)

    launched_at = time.monotonic()
    supervisor.launch(spec)
    exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    assert exited["exit_code"] == 4
    assert time.monotonic() - launched_at < READER_JOIN_S - 1  # nothing waited for a pipe that stays quiet
    assert batches(sent, spec.task_id) == [] and artifacts(sent, spec.task_id) == []


GRANDCHILD = """
    if "--grandchild" in sys.argv:
        emit({"kind": "metric", "step": 1, "from": "grandchild"})
        print("ready", flush=True)
        time.sleep(3600)
        sys.exit(0)
    escape = "--escape" in sys.argv
    grandchild = subprocess.Popen(
        [sys.executable, __file__, "--grandchild"], pass_fds=(FD,), stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if escape else None, start_new_session=escape,
    )
    assert grandchild.stdout.readline() == b"ready\\n"
    print(f"grandchild {grandchild.pid}", flush=True)
    emit({"kind": "metric", "step": 2, "from": "child"})
"""


def grandchild_pid(sent: Recorder, task_id: int) -> int:
    line = wait_until(
        lambda: next((t for t in sent.texts(task_id) if t.startswith("grandchild ")), None), 15, what="its pid"
    )
    return int(line.split()[1])


def test_a_grandchild_holding_the_metrics_pipe_does_not_delay_the_exit(supervisor, sent):
    spec = script_spec(GRANDCHILD)

    launched_at = time.monotonic()
    supervisor.launch(spec)
    exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    assert exited["exit_code"] == 0, sent.lines(spec.task_id)
    assert time.monotonic() - launched_at < READER_JOIN_S - 1  # the group kill ended it: EOF came at once
    assert [e["from"] for e in events(sent, spec.task_id)] == ["grandchild", "child"]
    pid = grandchild_pid(sent, spec.task_id)
    wait_until(lambda: gone(pid), timeout=3, what="the grandchild to be gone")


def test_a_process_that_escaped_the_group_with_the_pipe_delays_the_exit_only_boundedly(
    supervisor, sent, monkeypatch, caplog
):
    monkeypatch.setattr(task_run, "READER_JOIN_S", 0.5)
    spec = script_spec(GRANDCHILD, "--escape")

    with caplog.at_level(logging.WARNING, logger="worker_agent.supervision.metrics_pipe"):
        supervisor.launch(spec)
        pid = grandchild_pid(sent, spec.task_id)
        try:
            exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED, timeout=5)
            assert not gone(pid)  # the premise: it escaped the group kill and still holds the pipe
        finally:
            os.kill(pid, signal.SIGKILL)

    assert exited["exit_code"] == 0, sent.lines(spec.task_id)
    assert [e["from"] for e in events(sent, spec.task_id)] == ["grandchild", "child"]
    assert kinds(sent, spec.task_id)[-1] == TaskEventKind.EXITED
    assert "metrics pipe still open" in caplog.text
    wait_until(lambda: gone(pid), timeout=3, what="the escaped process to be gone")


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_no_pipe_is_left_open_in_the_agent(supervisor, sent):
    before = open_fds()
    specs = [script_spec(GRANDCHILD), script_spec('emit({"kind": "metric"})'), script_spec("pass")]
    failing = script_spec("pass", env={"BAD": "nul\x00byte"})  # Popen itself raises, after the pipe exists

    supervisor.launch(failing)
    for spec in specs:
        supervisor.launch(spec)
    for spec in specs:
        sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    assert sent.events(failing.task_id)[0]["kind"] == TaskEventKind.LAUNCH_FAILED
    wait_until(lambda: open_fds() <= before, timeout=3, what=f"the fds to be closed: {open_fds() - before}")
