"""A user's script finds no secret and cannot touch another job (issue 12, "tasks hold no secrets"), nor read another
job's script, arguments or config (issue 20).

Real orchestrator, a real agent as root with --task-uids (as in CI), real jobs: a first job keeps a secret and a
checkpoint in its folder; a second job's script looks everywhere it can (its environment, the agent's
/proc/<pid>/environ and cmdline, the agent's workdir, ledger and token file, the first job's folder) and reports.
Then a job runs with a secret in its arguments and config while another job's script looks for them.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from orchestrator.models import Host, HostStatus, Job, Task
from tests import factories
from tests.orchestrator.test_jobs_e2e import log_text, submit, wait_for_job
from tests.support.processes import wait_until
from tests.support.task_uids import TASK_UIDS
from worker_agent.supervision.identity import parse_range

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(os.geteuid() != 0, reason="task uids need the agent to run as root (CI does)"),
]

PRIVATE_PROC = "tasks get their own /tmp, /dev/shm and /proc"  # what the agent says when they do
PROBES = (
    "ids", "env", "agent_environ", "agent_cmdline", "workdir_list", "ledger_list", "running_list", "token_read",
    "workdir_write", "victim_list", "victim_read", "victim_write", "victim_checkpoint_write", "own_write",
)  # fmt: skip


def snooped(task: Task) -> dict[str, Any]:
    """The script's report, from its stored log (lines travel through the ingest, beside the exit: wait for them)."""

    def parsed() -> dict[str, Any] | None:
        found = {}
        for line in log_text(task).splitlines():
            if line.startswith("SNOOP "):
                _, name, value = line.split(" ", 2)
                found[name] = json.loads(value)
        return found if set(found) == set(PROBES) else None

    return wait_until(parsed, 30, what="every SNOOP line in the task's log")


def test_a_users_script_finds_no_secret_and_cannot_touch_another_job(api, orchestrator, start_agent, open_tmp):
    host, token = factories.host("iso-0", port_min=29700)
    Host.objects.filter(pk=host.pk).update(cpu_slots=2)
    agent = start_agent(host.name, token)
    wait_until(lambda: Host.objects.get(pk=host.pk).status == HostStatus.ONLINE, 30, what="the host online")
    workdir = open_tmp / f"agent-{host.name}"
    token_file = workdir / "token"
    one_worker = {"strategy": "mirrored", "workers": 1, "devices_per_worker": 1}

    victim_id = submit(api, "leaves_a_secret.py", **one_worker)
    victim_job = wait_for_job(victim_id)
    assert victim_job.state == "succeeded", (victim_job.reason, [log_text(t) for t in victim_job.current_tasks()])
    victim = workdir / "jobs" / str(victim_id) / "shared"
    spy_id = submit(api, "snoop.py", **one_worker, args=f"{workdir} {token_file} {victim}")
    spy_job = wait_for_job(spy_id)
    assert spy_job.state == "succeeded", (spy_job.reason, [log_text(t) for t in spy_job.current_tasks()])
    found = snooped(spy_job.current_tasks()[0])

    # It ran under a uid of its own from the range, without root's groups, at home in its own job folder.
    uids = parse_range(TASK_UIDS)
    ids = found["ids"]
    victim_uid = victim.stat().st_uid
    assert ids["uid"] == ids["euid"] == ids["gid"] and ids["uid"] in uids and ids["groups"] == []
    assert ids["ppid"] == agent.proc.pid  # what it read under /proc was the agent's
    # The control plane hands the next job the lowest free uid slot of its cluster, which is the victim's own once it
    # finished: so the victim's folder was handed back to root when its job ended (never left to the uid it had).
    assert victim_uid != ids["uid"] and (victim_uid == 0 or victim_uid in uids)
    assert found["env"]["HOME"] == str(workdir / "jobs" / str(spy_id))
    # No secret anywhere it looked: not the token, nor the control plane's URLs, passwords or keys.
    secrets = [token, settings.SECRET_KEY, os.environ["DATABASE_URL"], os.environ["REDIS_URL"], settings.REDIS_URL]
    secrets += [db["PASSWORD"] for db in settings.DATABASES.values() if db.get("PASSWORD")]
    everything = json.dumps(found)
    assert not [secret for secret in secrets if secret and secret in everything]
    markers = ("TOKEN", "PASSWORD", "SECRET", "_URL")
    assert not [name for name in found["env"] if any(marker in name.upper() for marker in markers)]
    # The agent's environment is closed to it. Its command line holds nothing secret; with a /proc of its own the task
    # does not even see the agent's process (a user's process elsewhere on the host does).
    assert found["agent_environ"]["ok"] is False
    if PRIVATE_PROC in agent.output():
        assert found["agent_cmdline"]["ok"] is False
    else:
        assert found["agent_cmdline"]["ok"] is True and "worker_agent" in found["agent_cmdline"]["value"]
    # The agent's files: not listable, not readable, not writable.
    for probe in ("workdir_list", "ledger_list", "running_list", "token_read", "workdir_write"):
        assert found[probe]["ok"] is False, (probe, found[probe])
    # The other job's folder: neither read nor written (its secret and its checkpoint are as it left them).
    for probe in ("victim_list", "victim_read", "victim_write", "victim_checkpoint_write"):
        assert found[probe]["ok"] is False, (probe, found[probe])
    assert (victim / "secret.txt").read_text() == "the victim's secret\n"
    assert (victim / "checkpoints" / "ckpt-1").read_text() == "the victim's weights\n"
    assert not (victim / "planted.txt").exists() and not (workdir / "planted.txt").exists()
    # What it may do: write its own folder, which is its job's alone.
    assert found["own_write"]["ok"] is True
    own = workdir / "jobs" / str(spy_id)
    assert own.stat().st_uid == ids["uid"] and stat.S_IMODE(own.stat().st_mode) == 0o700
    assert stat.S_IMODE((workdir / "jobs" / str(victim_id)).stat().st_mode) == 0o700
    assert Path(found["own_write"]["value"]).stat().st_uid == ids["uid"]


JOB_PROBES = ("cmdline", "environ", "script", "script_folder", "old_cache", "carrying")
SECRET_ARG = "sk-victims-own-api-key-31337"
SECRET_RATE = 0.0271828  # its config: reaches its task as TFDASH_LEARNING_RATE


def snooped_job(task: Task) -> dict[str, Any]:
    def parsed() -> dict[str, Any] | None:
        found = {}
        for line in log_text(task).splitlines():
            if line.startswith("SNOOPJOB "):
                _, name, value = line.split(" ", 2)
                found[name] = json.loads(value)
        return found if set(found) == set(JOB_PROBES) else None

    return wait_until(parsed, 30, what="every SNOOPJOB line in the task's log")


def test_another_jobs_script_arguments_and_config_are_unreadable_from_a_task(api, orchestrator, start_agent, open_tmp):
    host, token = factories.host("iso-1", port_min=29720)
    Host.objects.filter(pk=host.pk).update(cpu_slots=2)
    agent = start_agent(host.name, token)
    wait_until(lambda: Host.objects.get(pk=host.pk).status == HostStatus.ONLINE, 30, what="the host online")
    if PRIVATE_PROC not in agent.output():
        pytest.skip("tasks get no /proc of their own here (kernel < 5.8): mount /proc with hidepid=2 (README)")
    workdir = open_tmp / f"agent-{host.name}"
    gate = open_tmp / "gate"
    one_worker = {"strategy": "mirrored", "workers": 1, "devices_per_worker": 1}

    victim_id = submit(
        api,
        "waits_with_a_secret.py",
        **one_worker,
        args=f"{gate} --api-key {SECRET_ARG}",
        builtin_config=json.dumps({"learning_rate": SECRET_RATE}),
    )
    victim_task = wait_until(
        lambda: (tasks := list(Job.objects.get(pk=victim_id).current_tasks())) and tasks[0],
        60,
        what="the victim's task",
    )
    victim_pid = wait_until(
        lambda: next((int(t.split()[1]) for t in log_text(victim_task).splitlines() if t.startswith("RUNNING ")), 0),
        60,
        what="the victim running",
    )
    digest = Job.objects.get(pk=victim_id).script.sha256
    folder = f"{victim_task.type}-{victim_task.index}-a{victim_task.attempt}"
    script = workdir / "jobs" / str(victim_id) / folder / f"{digest}.py"
    assert script.exists()  # where its task runs it from
    spy_id = submit(
        api,
        "snoop_a_job.py",
        **one_worker,
        args=f"{victim_pid} {script} {workdir / 'scripts' / script.name} {SECRET_ARG} {SECRET_RATE}",
    )
    spy = wait_for_job(spy_id)
    gate.touch()
    victim = wait_for_job(victim_id)

    assert spy.state == "succeeded", (spy.reason, [log_text(t) for t in spy.current_tasks()])
    assert victim.state == "succeeded", (victim.reason, [log_text(t) for t in victim.current_tasks()])
    found = snooped_job(spy.current_tasks()[0])
    # Neither its command line (the secret argument) nor its environment (its config) nor its script.
    for probe in ("cmdline", "environ", "script", "script_folder", "old_cache"):
        assert found[probe]["ok"] is False, (probe, found[probe])
    # Nor any process of another uid that carries either: not even listed in the task's /proc.
    assert found["carrying"] == {"ok": True, "value": []}
