"""The supervisor against real child processes: events, logs, ports, kills, environment, and the signed-order path."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from celery import Celery

from contracts.protocol import (
    AGENT_KILL,
    AGENT_LAUNCH,
    TASK_EVENT,
    TASK_LOGS,
    KillOrder,
    LaunchSpec,
    ProgramSpec,
    TaskEventKind,
    agent_queue,
    sign,
    token_digest,
)
from tests.support.processes import wait_until
from tests.worker_agent.recording import Recorder, gone
from worker_agent.app import make_app
from worker_agent.supervisor import HOOKS_DIR, PACKAGE_ROOT

PROGRAMS = Path(__file__).resolve().parent / "programs"
_task_ids = itertools.count(1000)


def program(name: str) -> ProgramSpec:
    content = (PROGRAMS / name).read_bytes()
    return ProgramSpec(
        kind="script",
        script_b64=base64.b64encode(content).decode(),
        script_sha256=hashlib.sha256(content).hexdigest(),
    )


def spec_for(name: str, *args: str, **changes: Any) -> LaunchSpec:
    spec = LaunchSpec(
        job_id=7,
        task_id=next(_task_ids),
        attempt=0,
        task_type="worker",
        task_index=0,
        port=None,
        devices=[0],
        gpu=False,
        env={},
        program=replace(program(name), args=list(args)),
        kill_grace_s=1.0,
    )
    return replace(spec, **changes)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def test_it_lists_running_tasks_and_refuses_a_second_launch_of_the_same_attempt(supervisor, sent):
    spec = spec_for("stubborn.py")
    supervisor.launch(spec)
    started = sent.wait_for(spec.task_id, TaskEventKind.STARTED)

    supervisor.launch(spec)

    refused = sent.wait_for(spec.task_id, TaskEventKind.LAUNCH_FAILED)
    assert "already running" in refused["detail"]
    assert supervisor.running() == [
        {"task_id": spec.task_id, "attempt": 0, "pid": started["pid"], "job_id": spec.job_id}
    ]


def test_a_redelivered_launch_of_an_attempt_that_already_ran_is_dropped(supervisor, sent, caplog):
    spec = spec_for("chatty.py", "0")
    supervisor.launch(spec)
    sent.wait_for(spec.task_id, TaskEventKind.EXITED)
    before = len(sent.of(spec.task_id))

    with caplog.at_level(logging.WARNING, logger="worker_agent.supervisor"):
        supervisor.launch(spec)

    assert len(sent.of(spec.task_id)) == before
    assert supervisor.running() == []
    assert "it already ran" in caplog.text


# --- ports ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["child", "grandchild"])
def test_it_reports_listening_once_a_process_of_the_task_listens_on_its_port(supervisor, sent, where):
    port = free_port()
    args = [str(port), *(["--in-child"] if where == "grandchild" else [])]
    spec = spec_for("listen.py", *args, port=port)

    supervisor.launch(spec)
    listening = sent.wait_for(spec.task_id, TaskEventKind.LISTENING)

    assert [e["kind"] for e in sent.events(spec.task_id)] == [TaskEventKind.STARTED, TaskEventKind.LISTENING]
    assert listening["pid"] == sent.events(spec.task_id)[0]["pid"]


def test_it_reports_a_port_conflict_and_starts_nothing(supervisor, sent, tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        spec = spec_for("stubborn.py", "--pidfile", str(tmp_path / "pids"), port=port)

        supervisor.launch(spec)

    [event] = sent.events(spec.task_id)
    assert event["kind"] == TaskEventKind.PORT_CONFLICT
    assert "Address already in use" in event["detail"]
    assert supervisor.running() == []
    assert not (tmp_path / "pids").exists()


def test_it_refuses_a_port_another_of_its_tasks_holds(supervisor, sent):
    port = free_port()
    first = spec_for("listen.py", str(port), port=port)
    supervisor.launch(first)
    sent.wait_for(first.task_id, TaskEventKind.STARTED)

    second = spec_for("listen.py", str(port), port=port)
    supervisor.launch(second)

    [event] = sent.events(second.task_id)
    assert event["kind"] == TaskEventKind.PORT_CONFLICT
    assert f"held by task {first.task_id}" in event["detail"]


def test_it_launches_on_a_port_held_only_by_time_wait_leftovers(supervisor, sent):
    # What a killed TF task leaves behind: its server port in TIME_WAIT for a minute. gRPC (SO_REUSEADDR) binds
    # it fine, so a gang restarted on the same ports must not see a conflict.
    port = free_port()
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))
        server.listen()
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: its end of the connection goes to TIME_WAIT
        wait_until(lambda: client.recv(1) == b"", timeout=5, what="the FIN")
        client.close()
    with pytest.raises(OSError, match="Address already in use"), socket.socket() as probe:
        probe.bind(("0.0.0.0", port))  # the premise: a plain bind is refused
    spec = spec_for("listen.py", str(port), port=port)

    supervisor.launch(spec)

    sent.wait_for(spec.task_id, TaskEventKind.LISTENING)


# --- refusals -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"script_sha256": "0" * 64}, "sha256 mismatch"),
        ({"script_b64": "not base64!"}, "not valid base64"),
        ({"kind": "docker"}, "unknown program kind 'docker'"),
    ],
)
def test_it_refuses_a_bad_program(supervisor, sent, change, detail, tmp_path):
    spec = spec_for("stubborn.py", "--pidfile", str(tmp_path / "pids"))
    spec = replace(spec, program=replace(spec.program, **change))

    supervisor.launch(spec)

    [event] = sent.events(spec.task_id)
    assert event["kind"] == TaskEventKind.LAUNCH_FAILED
    assert detail in event["detail"]
    assert supervisor.running() == []
    assert not (tmp_path / "pids").exists()


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"env": {"BAD": "nul\x00byte"}}, "could not start"),  # Popen itself raises
        ({"task_type": "../../etc"}, "task_type"),  # would become a path
        ({"port": "23000"}, "port"),
    ],
)
def test_it_refuses_a_spec_it_cannot_start(supervisor, sent, change, detail):
    spec = spec_for("chatty.py", "0", **change)

    supervisor.launch(spec)

    [event] = sent.events(spec.task_id)
    assert event["kind"] == TaskEventKind.LAUNCH_FAILED
    assert detail in event["detail"]
    assert supervisor.running() == []


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


def test_kill_of_an_unknown_task_is_ignored(supervisor, sent):
    supervisor.kill(KillOrder(job_id=1, task_id=999_999, attempt=0))

    assert sent.messages == []


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


# --- environment ----------------------------------------------------------------------------------------------------
def child_report(sent: Recorder, task_id: int) -> dict[str, Any]:
    sent.wait_for(task_id, TaskEventKind.EXITED)
    return json.loads(sent.texts(task_id)[-1])


def test_a_cpu_task_gets_its_tf_config_and_devices_but_not_the_agent_secrets(supervisor, sent, monkeypatch, tmp_path):
    monkeypatch.setenv("TFDASH_AGENT_TOKEN", "tfa_secret")
    monkeypatch.setenv("SOME_PASSWORD", "hunter2")
    monkeypatch.setenv("PYTHONPATH", "/opt/existing")
    tf_config = json.dumps({"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 1}})
    spec = spec_for("show_env.py", env={"TF_CONFIG": tf_config}, task_index=1, attempt=2)

    supervisor.launch(spec)
    report = child_report(sent, spec.task_id)

    env = report["env"]
    assert env["TF_CONFIG"] == tf_config
    assert "TFDASH_AGENT_TOKEN" not in env and "SOME_PASSWORD" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["TFDASH_LOGICAL_CPU_DEVICES"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert (env["TFDASH_JOB_ID"], env["TFDASH_TASK_ID"]) == (str(spec.job_id), str(spec.task_id))
    assert (env["TFDASH_TASK_TYPE"], env["TFDASH_TASK_INDEX"], env["TFDASH_ATTEMPT"]) == ("worker", "1", "2")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(HOOKS_DIR), "/opt/existing", str(PACKAGE_ROOT)]
    assert report["cwd"] == str(tmp_path / "agent" / "jobs" / str(spec.job_id) / "worker-1-a2")
    assert report["worker_agent_importable"]
    assert not report["tensorflow_loaded"]  # one device: the hook imports nothing


def test_a_gpu_task_sees_only_its_devices(supervisor, sent):
    spec = spec_for("show_env.py", gpu=True, devices=[2, 3])

    supervisor.launch(spec)
    env = child_report(sent, spec.task_id)["env"]

    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "TFDASH_LOGICAL_CPU_DEVICES" not in env


def test_the_hook_runs_a_sitecustomize_it_shadows(supervisor, sent, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys\nsys.tfdash_test_chained = True\n")
    spec = spec_for("show_env.py", env={"PYTHONPATH": str(other)})

    supervisor.launch(spec)

    assert child_report(sent, spec.task_id)["chained"] is True


def test_scripts_are_cached_by_content(supervisor, sent, tmp_path):
    first, second = spec_for("chatty.py", "0"), spec_for("chatty.py", "0")
    for spec in (first, second):
        supervisor.launch(spec)
        sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    assert [p.name for p in (tmp_path / "agent" / "scripts").iterdir()] == [f"{first.program.script_sha256}.py"]


def test_a_builtin_program_runs_the_runtime_module(supervisor):
    argv = supervisor._argv(ProgramSpec(kind="builtin", builtin="mlp", builtin_config={"epochs": 2}, args=["-v"]))

    assert argv == [
        sys.executable, "-u", "-m", "worker_agent.runtime",
        "--program", "mlp", "--config-json", '{"epochs": 2}', "-v",
    ]  # fmt: skip


def test_a_tensorflow_task_on_two_cpu_devices_sees_two_logical_cpus(supervisor, sent):
    spec = spec_for("tf_devices.py", devices=[0, 1], env={"TF_CPP_MIN_LOG_LEVEL": "2"})

    supervisor.launch(spec)
    exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED, timeout=60)

    assert exited["exit_code"] == 0, sent.lines(spec.task_id)
    assert "logical cpus: 2" in sent.texts(spec.task_id)


# --- signed orders (app.py) -----------------------------------------------------------------------------------------
class FakeRunner:
    def __init__(self) -> None:
        self.launched: list[LaunchSpec] = []
        self.killed: list[KillOrder] = []

    def launch(self, spec: LaunchSpec) -> None:
        self.launched.append(spec)

    def kill(self, order: KillOrder) -> None:
        self.killed.append(order)


@pytest.fixture
def runner_app() -> tuple[Celery, FakeRunner]:
    runner = FakeRunner()
    return make_app("redis://127.0.0.1:1/0", "gpu-1", "tfa_right", runner), runner


def test_a_signed_launch_and_kill_reach_the_supervisor(runner_app):
    app, runner = runner_app
    spec = spec_for("chatty.py", "0")
    key = token_digest("tfa_right")

    app.tasks[AGENT_LAUNCH](sign(asdict(spec), key))
    app.tasks[AGENT_KILL](sign({"job_id": 7, "task_id": spec.task_id, "attempt": 0, "reason": "r"}, key))

    assert runner.launched == [spec]
    assert runner.killed == [KillOrder(job_id=7, task_id=spec.task_id, attempt=0, reason="r")]


@pytest.mark.parametrize(
    "message",
    [
        sign({"job_id": 7, "task_id": 1, "attempt": 0}, token_digest("tfa_wrong")),
        sign({"job_id": 7, "task_id": 1, "attempt": 0}, "tfa_right"),  # the token itself is not the key
        {"body": json.dumps({"job_id": 7, "task_id": 1, "attempt": 0}), "mac": "0" * 64},
        {"job_id": 7, "task_id": 1, "attempt": 0},  # unsigned
        None,
    ],
)
def test_an_order_without_a_valid_signature_is_dropped(runner_app, caplog, message):
    app, runner = runner_app

    with caplog.at_level(logging.WARNING, logger="worker_agent.app"):
        app.tasks[AGENT_LAUNCH](message)
        app.tasks[AGENT_KILL](message)

    assert runner.launched == [] and runner.killed == []
    assert caplog.text.count("dropping agent.") == 2


def test_a_signed_but_malformed_order_is_dropped(runner_app, caplog):
    app, runner = runner_app
    key = token_digest("tfa_right")

    with caplog.at_level(logging.WARNING, logger="worker_agent.app"):
        app.tasks[AGENT_LAUNCH](sign({"job_id": 7}, key))
        app.tasks[AGENT_KILL](sign({"job_id": 7, "colour": "red"}, key))

    assert runner.launched == [] and runner.killed == []
    assert "malformed launch spec" in caplog.text and "malformed kill order" in caplog.text


# --- the real agent -------------------------------------------------------------------------------------------------
def test_a_real_agent_launches_a_signed_order_and_kills_its_tasks_when_stopped(start_agent, redis_url, tmp_path):
    host, token = f"sup-{os.getpid()}", "tfa_agent_test"
    agent = start_agent(host, token)
    pidfile = tmp_path / "pids"
    spec = spec_for("stubborn.py", "--pidfile", str(pidfile))
    client = Celery("test-client", broker=redis_url, set_as_current=False)

    client.send_task(AGENT_LAUNCH, args=[sign(asdict(spec), token_digest(token))], queue=agent_queue(host))
    wait_until(pidfile.exists, timeout=30, what="the task to start")
    child, grandchild = map(int, pidfile.read_text().split())
    assert psutil.Process(child).ppid() == agent.pid

    assert agent.terminate(timeout=20) == 0
    agent.stop()  # joins the output reader

    assert gone(child) and gone(grandchild)
    output = agent.output()
    assert "agent shutting down: killing 1 task(s)" in output
    assert "agent stopped: outbox flushed" in output
