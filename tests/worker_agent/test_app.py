"""The agent app: signed orders reach the supervisor, anything else is dropped; a real agent end to end."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict

import psutil
import pytest
from celery import Celery
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contracts.protocol import AGENT_KILL, AGENT_LAUNCH, agent_queue
from contracts.signing import sign_order
from contracts.task_messages import KillOrder, LaunchSpec
from tests.support.processes import gone, wait_until
from tests.support.wire import broker_user, signed_order
from tests.worker_agent.supervision.specs import spec_for
from worker_agent.app import make_app
from worker_agent.orders import OrderGate

CONTROL = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()


def order(kind: str, body: dict, *, key: Ed25519PrivateKey = CONTROL, host: str = "gpu-1") -> dict:
    return sign_order(key, host, kind, body)


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
def runner_app(tmp_path) -> tuple[Celery, FakeRunner]:  # type: ignore[no-untyped-def]
    runner = FakeRunner()
    gate = OrderGate(CONTROL.public_key(), "gpu-1", tmp_path)
    return make_app("redis://127.0.0.1:1/0", "gpu-1", gate, runner), runner


def test_a_signed_launch_and_kill_reach_the_supervisor(runner_app):
    app, runner = runner_app
    spec = spec_for("chatty.py", "0")

    app.tasks[AGENT_LAUNCH](order(AGENT_LAUNCH, asdict(spec)))
    app.tasks[AGENT_KILL](order(AGENT_KILL, {"job_id": 7, "task_id": spec.task_id, "attempt": 0, "reason": "r"}))

    assert runner.launched == [spec]
    assert runner.killed == [KillOrder(job_id=7, task_id=spec.task_id, attempt=0, reason="r")]


@pytest.mark.parametrize(
    "message",
    [
        order(AGENT_KILL, {"job_id": 7, "task_id": 1, "attempt": 0}, key=OTHER),  # not the pinned key
        order(AGENT_KILL, {"job_id": 7, "task_id": 1, "attempt": 0}, host="gpu-2"),  # another host's
        {"order": json.dumps({"job_id": 7, "task_id": 1, "attempt": 0}), "sig": "0" * 88},
        {"body": json.dumps({"job_id": 7, "task_id": 1, "attempt": 0}), "mac": "0" * 64},  # protocol 2
        {"job_id": 7, "task_id": 1, "attempt": 0},  # unsigned
        None,
    ],
    ids=["other key", "other host", "bad signature", "HMAC", "unsigned", "None"],
)
def test_an_order_without_a_valid_signature_is_dropped(runner_app, caplog, message):
    app, runner = runner_app

    with caplog.at_level(logging.WARNING, logger="worker_agent.app"):
        app.tasks[AGENT_LAUNCH](message)
        app.tasks[AGENT_KILL](message)

    assert runner.launched == [] and runner.killed == []
    assert caplog.text.count("refused agent.") == 2


def test_an_order_delivered_as_another_kind_or_twice_is_refused(runner_app, caplog):
    app, runner = runner_app
    kill = order(AGENT_KILL, {"job_id": 7, "task_id": 1, "attempt": 0})

    with caplog.at_level(logging.WARNING, logger="worker_agent.app"):
        app.tasks[AGENT_LAUNCH](kill)  # a kill presented as a launch
        app.tasks[AGENT_KILL](kill)
        app.tasks[AGENT_KILL](kill)  # the same order again

    assert runner.killed == [KillOrder(job_id=7, task_id=1, attempt=0)]
    assert "delivered as 'agent.launch'" in caplog.text and "was seen before" in caplog.text


def test_a_signed_but_malformed_order_is_dropped(runner_app, caplog):
    app, runner = runner_app

    with caplog.at_level(logging.WARNING, logger="worker_agent.app"):
        app.tasks[AGENT_LAUNCH](order(AGENT_LAUNCH, {"job_id": 7}))
        app.tasks[AGENT_KILL](order(AGENT_KILL, {"job_id": 7, "colour": "red"}))

    assert runner.launched == [] and runner.killed == []
    assert "malformed launch spec" in caplog.text and "malformed kill order" in caplog.text


# --- the real agent -------------------------------------------------------------------------------------------------
def test_a_real_agent_launches_a_signed_order_and_kills_its_tasks_when_stopped(start_agent, redis_url, open_tmp):
    host, token = f"sup-{os.getpid()}", "tfa_agent_test"
    broker_user(redis_url, host, token)  # a host the database does not know: its broker user made by hand
    agent = start_agent(host, token)
    out = open_tmp / "out"
    out.mkdir()
    out.chmod(0o1777)  # the task, under its job's uid, writes there
    pidfile = out / "pids"
    spec = spec_for("stubborn.py", "--pidfile", str(pidfile))
    client = Celery("test-client", broker=redis_url, set_as_current=False)

    client.send_task(AGENT_LAUNCH, args=[signed_order(host, AGENT_LAUNCH, asdict(spec))], queue=agent_queue(host))
    wait_until(pidfile.exists, timeout=30, what="the task to start")
    child, grandchild = map(int, pidfile.read_text().split())
    assert psutil.Process(child).ppid() == agent.pid

    assert agent.terminate(timeout=20) == 0
    agent.stop()  # joins the output reader

    assert gone(child) and gone(grandchild)
    output = agent.output()
    assert "agent shutting down: killing 1 task(s)" in output
    assert "agent stopped: outbox flushed" in output
