"""The agent app: signed orders reach the supervisor, anything else is dropped; a real agent end to end."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict

import psutil
import pytest
from celery import Celery

from contracts.protocol import (
    AGENT_KILL,
    AGENT_LAUNCH,
    KillOrder,
    LaunchSpec,
    agent_queue,
    sign,
    token_digest,
)
from tests.support.processes import wait_until
from tests.worker_agent.recording import gone
from tests.worker_agent.supervision.specs import spec_for
from worker_agent.app import make_app


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
def test_a_real_agent_launches_a_signed_order_and_kills_its_tasks_when_stopped(start_agent, redis_url, open_tmp):
    host, token = f"sup-{os.getpid()}", "tfa_agent_test"
    agent = start_agent(host, token)
    out = open_tmp / "out"
    out.mkdir()
    out.chmod(0o1777)  # the task, under its job's uid, writes there
    pidfile = out / "pids"
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
