"""Before and at a start, against real child processes: ports, refusals, the environment a task gets."""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from contracts.task_messages import ProgramSpec, TaskEventKind
from tests.support.ports import free_port
from tests.support.processes import wait_until
from tests.worker_agent.recording import Recorder
from tests.worker_agent.supervision.specs import PROGRAMS, spec_for
from worker_agent.supervision import programs
from worker_agent.supervision.runtime_root import PACKAGE_ROOT, runtime_pythonpath


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


def test_it_reports_a_port_conflict_and_starts_nothing(supervisor, sent, shared):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        spec = spec_for("stubborn.py", "--pidfile", str(shared / "pids"), port=port)

        supervisor.launch(spec)

    [event] = sent.events(spec.task_id)
    assert event["kind"] == TaskEventKind.PORT_CONFLICT
    assert "Address already in use" in event["detail"]
    assert supervisor.running() == []
    assert not (shared / "pids").exists()


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
def test_it_refuses_a_bad_program(supervisor, sent, change, detail, shared):
    spec = spec_for("stubborn.py", "--pidfile", str(shared / "pids"))
    spec = replace(spec, program=replace(spec.program, **change))

    supervisor.launch(spec)

    [event] = sent.events(spec.task_id)
    assert event["kind"] == TaskEventKind.LAUNCH_FAILED
    assert detail in event["detail"]
    assert supervisor.running() == []
    assert not (shared / "pids").exists()


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


# --- environment ----------------------------------------------------------------------------------------------------
def child_report(sent: Recorder, task_id: int) -> dict[str, Any]:
    sent.wait_for(task_id, TaskEventKind.EXITED)
    return json.loads(sent.texts(task_id)[-1])


def test_a_cpu_task_gets_its_tf_config_and_devices_but_not_the_agent_secrets(supervisor, sent, monkeypatch, tmp_path):
    monkeypatch.setenv("TFDASH_AGENT_TOKEN", "tfa_secret")
    monkeypatch.setenv("SOME_PASSWORD", "hunter2")
    monkeypatch.setenv("DATABASE_URL", "postgres://tfdash:pw@db/tfdash")  # no marker in the name: not allowed either
    monkeypatch.setenv("REDIS_URL", "redis://:pw@redis:6379/0")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")  # what TF reads passes
    monkeypatch.setenv("TF_API_TOKEN", "x")  # but never a secret, even under an allowed prefix
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/existing", str(PACKAGE_ROOT)]))
    tf_config = json.dumps({"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 1}})
    spec = spec_for("show_env.py", env={"TF_CONFIG": tf_config}, task_index=1, attempt=2)

    supervisor.launch(spec)
    report = child_report(sent, spec.task_id)

    env = report["env"]
    assert env["TF_CONFIG"] == tf_config
    assert not {"TFDASH_AGENT_TOKEN", "SOME_PASSWORD", "DATABASE_URL", "REDIS_URL", "TF_API_TOKEN"} & env.keys()
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2" and env["PATH"] == os.environ["PATH"]
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["TFDASH_LOGICAL_CPU_DEVICES"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert (env["TFDASH_JOB_ID"], env["TFDASH_TASK_ID"]) == (str(spec.job_id), str(spec.task_id))
    assert (env["TFDASH_TASK_TYPE"], env["TFDASH_TASK_INDEX"], env["TFDASH_ATTEMPT"]) == ("worker", "1", "2")
    # The runtime set's copy under the workdir (hooks, then its root), then the agent's own entries less its checkout.
    assert env["PYTHONPATH"].split(os.pathsep) == [*runtime_pythonpath(tmp_path / "agent"), "/opt/existing"]
    assert report["cwd"] == str(tmp_path / "agent" / "jobs" / str(spec.job_id) / "worker-1-a2")
    assert report["worker_agent_importable"]
    root = runtime_pythonpath(tmp_path / "agent")[-1]
    assert report["worker_agent_origin"] == os.path.join(root, "worker_agent", "__init__.py")  # the copy's, not ours
    assert not report["tensorflow_loaded"]  # one device: the hook imports nothing


def test_a_task_gets_its_jobs_own_variables_under_the_ones_tfdash_sets(supervisor, sent, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "8")  # inherited from the agent; the job's own value wins
    tf_config = json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}})
    user_env = {"DATA": "/shared/digits.npz", "OMP_NUM_THREADS": "2", "WITH_SPACES": " a = b "}
    spec = spec_for("show_env.py", env={"TF_CONFIG": tf_config}, user_env=user_env)

    supervisor.launch(spec)
    env = child_report(sent, spec.task_id)["env"]

    assert {k: env[k] for k in user_env} == user_env
    assert env["TF_CONFIG"] == tf_config and env["TFDASH_JOB_ID"] == str(spec.job_id)


@pytest.mark.parametrize(
    ("user_env", "named"),
    [
        ({"TF_CONFIG": "{}"}, "TF_CONFIG is reserved"),
        ({"LD_PRELOAD": "/tmp/evil.so"}, "LD_PRELOAD is reserved"),
        ({"tfdash_job_id": "9"}, "tfdash_job_id is reserved"),  # any case
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "CUDA_VISIBLE_DEVICES is reserved"),
        ({"1BAD": "x"}, "'1BAD' is not a variable name"),
        ({"OK": 3}, "OK's value must be a string"),
    ],
)
def test_it_refuses_an_order_whose_job_variables_break_the_rules(supervisor, sent, user_env, named, tmp_path):
    """An order is data: the agent checks the job's variables again (contracts/job_env.py), starting nothing."""
    spec = spec_for("stubborn.py", "--pidfile", str(tmp_path / "pids"), user_env=user_env)

    supervisor.launch(spec)

    [event] = sent.events(spec.task_id)
    assert event["kind"] == TaskEventKind.LAUNCH_FAILED
    assert named in event["detail"]
    assert supervisor.running() == []
    assert not (tmp_path / "pids").exists()


def test_a_gpu_task_sees_only_its_devices(supervisor, sent):
    spec = spec_for("show_env.py", gpu=True, devices=[2, 3])

    supervisor.launch(spec)
    env = child_report(sent, spec.task_id)["env"]

    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "TFDASH_LOGICAL_CPU_DEVICES" not in env


def test_the_hook_runs_a_sitecustomize_it_shadows(supervisor, sent, shared):
    other = shared / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys\nsys.tfdash_test_chained = True\n")
    spec = spec_for("show_env.py", env={"PYTHONPATH": str(other)})

    supervisor.launch(spec)

    assert child_report(sent, spec.task_id)["chained"] is True


def test_each_task_runs_its_own_copy_of_its_script_from_its_own_folder(supervisor, sent, tmp_path):
    first, second = spec_for("chatty.py", "0"), spec_for("chatty.py", "0", task_index=1)
    for spec in (first, second):
        supervisor.launch(spec)
        sent.wait_for(spec.task_id, TaskEventKind.EXITED)

    home = tmp_path / "agent" / "jobs" / str(first.job_id)
    name = f"{first.program.script_sha256}.py"
    copies = [home / "worker-0-a0" / name, home / "worker-1-a0" / name]
    assert [path.read_bytes() for path in copies] == [(PROGRAMS / "chatty.py").read_bytes()] * 2
    assert not (tmp_path / "agent" / "scripts").exists()  # no cache shared by every job


def test_a_builtin_program_runs_the_runtime_module_with_its_config_in_its_environment():
    program = programs.load(ProgramSpec(kind="builtin", builtin="mlp", builtin_config={"epochs": 2}, args=["-v"]))
    argv = program.argv(Path("/anywhere"))

    assert argv == [sys.executable, "-u", "-m", "worker_agent.runtime", "--program", "mlp", "-v"]
    assert program.env() == {"TFDASH_PROGRAM_CONFIG": '{"epochs": 2}'}


def test_a_tensorflow_task_on_two_cpu_devices_sees_two_logical_cpus(supervisor, sent):
    spec = spec_for("tf_devices.py", devices=[0, 1], env={"TF_CPP_MIN_LOG_LEVEL": "2"})

    supervisor.launch(spec)
    exited = sent.wait_for(spec.task_id, TaskEventKind.EXITED, timeout=60)

    assert exited["exit_code"] == 0, sent.lines(spec.task_id)
    assert "logical cpus: 2" in sent.texts(spec.task_id)
