"""One uid per job across a cluster's hosts (issue 42): two live jobs on hosts of one cluster never share a task uid,
and one job's tasks on two hosts share one, so both write the job's folder in the cluster's shared folder.

Real orchestrator and scheduler, three real agents as root with the same two-uid `--task-uids` range (as hosts of a
cluster sharing a folder are set up), real jobs of a plain Python script (tests/programs/shared_folder_uid.py).
"""

from __future__ import annotations

import json
import os

import pytest

from orchestrator.models import Host, HostStatus, Job, JobState
from tests import factories
from tests.orchestrator.test_jobs_e2e import log_text, submit, wait_for_job
from tests.support.processes import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(os.geteuid() != 0, reason="task uids need the agent to run as root (CI does)"),
]

UIDS = "30700-30701"  # two uids on every host: each host alone gives jobs an even id apart the same one


def lines(job: Job, prefix: str) -> list[str]:
    """The rest of each current task's first line starting with `prefix`, once every task has printed one."""

    def found() -> list[str] | None:
        # Read the job again each time: placed after it was fetched, its attempt (which current_tasks filters on) was
        # the stale one, no task matched, and an empty list kept the wait going to its end (the two CI-like failures).
        job.refresh_from_db(fields=["attempt"])
        tasks = list(job.current_tasks())
        if not tasks:
            return None
        seen = []
        for task in tasks:
            rest = next((t[len(prefix) :] for t in log_text(task).splitlines() if t.startswith(prefix)), None)
            if rest is None:
                return None
            seen.append(rest)
        return seen

    try:
        return wait_until(found, 120, what=f"a {prefix!r} line from every task of job {job.pk}")
    except AssertionError as exc:
        job.refresh_from_db()
        tasks = [(t.host.name, t.state, t.detail, log_text(t)[-500:]) for t in job.current_tasks()]
        raise AssertionError(f"{exc}; job {job.state}: {job.reason}; tasks {tasks}") from None


def test_two_live_jobs_never_share_a_uid_and_one_jobs_tasks_on_two_hosts_share_one(
    api, orchestrator, start_agent, open_tmp, alice
):
    cluster = factories.cluster()
    cluster.shared_dir = str(open_tmp / "shared")
    cluster.save()
    for i in range(3):
        host, token = factories.host(f"uids-{i}", port_min=29700 + 10 * i)
        Host.objects.filter(pk=host.pk).update(port_max=29700 + 10 * i + 9, cpu_slots=2)
        start_agent(host.name, token, "--task-uids", UIDS)
    wait_until(lambda: Host.objects.filter(status=HostStatus.ONLINE).count() == 3, 30, what="3 hosts online")
    gate = open_tmp / "gate"  # under the agents' shared root: tasks see it
    args = str(gate)

    # A whole host per worker: the wide job runs on two hosts, the narrow one on the third.
    wide = submit(api, "shared_folder_uid.py", strategy="multi_worker_mirrored", workers=2, devices_per_worker=2,
                  args=args)  # fmt: skip
    # Make the narrow job's id even-apart from the wide one's, where each host alone picked one uid (job id modulo
    # the range): ended fillers until the next id is (ids are consecutive here, but a sequence may skip some).
    last = wide
    while (last + 1 - wide) % 2:
        filler = Job.objects.create(owner=alice, cluster=cluster, name="filler", strategy="mirrored",
                                    program_kind="builtin", builtin="digits_mlp", state=JobState.CANCELLED)  # fmt: skip
        last = filler.pk
    narrow = submit(api, "shared_folder_uid.py", strategy="mirrored", workers=1, devices_per_worker=1, args=args)
    assert (narrow - wide) % 2 == 0

    wide_uids = {int(uid) for uid in lines(Job.objects.get(pk=wide), "UID ")}
    narrow_uids = {int(uid) for uid in lines(Job.objects.get(pk=narrow), "UID ")}  # both jobs live now
    hosts = {task.host_id for task in Job.objects.get(pk=wide).current_tasks()}
    gate.touch()

    assert len(hosts) == 2 and len(wide_uids) == 1  # one job on two hosts: one uid
    assert wide_uids.isdisjoint(narrow_uids)  # two live jobs of the cluster: two uids
    for job_id in (wide, narrow):
        job = wait_for_job(job_id)
        assert job.state == "succeeded", (job.reason, [log_text(t)[-2000:] for t in job.current_tasks()])
    peers = [json.loads(text) for text in lines(Job.objects.get(pk=wide), "PEERS ")]
    assert peers and all(list(each.values()) == ["ok"] for each in peers)  # each wrote the other's file
