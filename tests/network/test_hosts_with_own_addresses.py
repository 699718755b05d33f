"""Hosts with their own addresses, reached over a network (tests/network/conftest.py): MultiWorkerMirrored and
ParameterServer jobs across network namespaces, each task's TF_CONFIG naming its own host's address; metric points,
log lines and the saved model (through the object store, by presigned URL) arrive from inside the namespaces; a host
whose cable is pulled mid-job is marked offline and the job's gang restarts on the hosts left."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.models import ACTIVE_TASK_STATES, Host, HostStatus, Job, JobArtifact, MetricPoint, Task
from tests.network.conftest import DB, TF_PORTS, NetnsCluster, tasks_of
from tests.support.processes import wait_until

pytestmark = [
    pytest.mark.netns,
    pytest.mark.django_db(transaction=True, databases=[DB]),
    # Starting the control plane and TF processes on a shared 2-core machine: minutes, not the suite's 300 s.
    pytest.mark.timeout(900),
]

FINAL = ("succeeded", "failed", "cancelled", "timed_out")


def submit(cluster: NetnsCluster, strategy: str, config: dict[str, Any], **shape: Any) -> int:
    """A built-in program's job, submitted over the network as its owner."""
    body = {"name": f"netns {strategy}", "strategy": strategy, "builtin": "digits_mlp", "builtin_config": config,
            "max_restarts": 1, **shape}  # fmt: skip
    answer = cluster.user.post(f"{cluster.plane.web_url}/api/jobs/", json=body, timeout=30)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def wait_for_job(cluster: NetnsCluster, job_id: int, states: tuple[str, ...] = FINAL, timeout: float = 420) -> Job:
    def reached() -> Job | bool:
        job = Job.objects.using(DB).get(pk=job_id)
        if job.state in FINAL and job.state not in states:  # it will never get there: say why now, not at the timeout
            raise AssertionError(f"job {job_id} ended {job.state} waiting for {states}: {why(cluster, job)}")
        return job.state in states and job

    try:
        return wait_until(
            reached,
            timeout,
            interval=0.5,
            what=f"job {job_id} to reach {states}",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.agent_said()}\n{cluster.plane.said('error|warn')}") from None


def why(cluster: NetnsCluster, job: Job) -> str:
    """A failed job's reason, its tasks' last lines and what the agents said, for a failure's message."""
    tasks = Task.objects.using(DB).filter(job=job).select_related("host")
    tails = [f"--- {t.type} {t.index} on {t.host.name if t.host else '-'} ({t.attempt}):\n{log_text(t.pk)[-2500:]}"
             for t in tasks]  # fmt: skip
    return "\n".join([job.reason, *tails, cluster.agent_said("error|warn|refus")])


def log_text(task_id: int) -> str:
    return "\n".join(Task.objects.using(DB).get(pk=task_id).log_lines.order_by("seq").values_list("text", flat=True))


def assert_each_task_names_its_own_host(cluster: NetnsCluster, tasks: list[dict[str, Any]]) -> None:
    """Each task's TF_CONFIG, as the API shows it, names its own host's namespace address at its port, and the whole
    cluster in it lists only namespace addresses."""
    addresses = {name: host.address for name, host in cluster.hosts.items()}
    for task in tasks:
        config = task["tf_config"]
        me = config["task"]
        assert (me["type"], me["index"]) == (task["type"], task["index"]), task
        assert task["address"] == addresses[task["host"]], task
        assert config["cluster"][me["type"]][me["index"]] == f"{addresses[task['host']]}:{task['port']}", task
        named = {entry.rsplit(":", 1)[0] for entries in config["cluster"].values() for entry in entries}
        assert named <= set(addresses.values()), config


def assert_points_lines_and_model_arrived(cluster: NetnsCluster, job: Job, chief: dict[str, Any]) -> None:
    """What the agents inside the namespaces sent reached the control plane: every task's metric points (through
    Redis) and the chief's log lines; the saved model went to the object store by presigned URL."""
    # Those that run the training loop report points: every MultiWorkerMirrored worker, a ParameterServer's chief.
    trainers = Task.objects.using(DB).filter(job=job, attempt=job.attempt).exclude(type="ps")
    if job.strategy == "parameter_server":
        trainers = trainers.filter(type="chief")
    for task in trainers:
        wait_until(
            lambda task=task: MetricPoint.objects.using(DB).filter(task=task, phase="epoch_end", name="loss").exists(),
            60,
            what=f"{task.type} {task.index}'s epoch points",
        )
    wait_until(lambda: "done in" in log_text(chief["id"]), 60, what="the chief's closing line")
    artifact = wait_until(
        lambda: JobArtifact.objects.using(DB).filter(job=job).exclude(key="").first(),
        90,
        what=f"the saved model in the store\n{cluster.agent_said('store|artifact')}",
    )
    store = cluster.plane.store
    head = store.client().head_object(Bucket=store.bucket, Key=artifact.key)
    assert head["ContentLength"] == artifact.size > 0


def test_multi_worker_mirrored_across_two_hosts_with_their_own_addresses(netns_cluster) -> None:
    cluster = netns_cluster(2)
    config = {"epochs": 3, "per_replica_batch": 32, "steps_per_epoch": 20}

    job_id = submit(cluster, "multi_worker_mirrored", config, workers=2, devices_per_worker=1)
    job = wait_for_job(cluster, job_id)

    assert job.state == "succeeded", why(cluster, job)
    tasks = tasks_of(cluster, job_id)
    assert {(t["type"], t["index"]) for t in tasks} == {("worker", 0), ("worker", 1)}
    assert {t["host"] for t in tasks} == {"n0", "n1"}  # one worker per machine: they talked gRPC over the bridge
    # Machines of their own have ports of their own: both took the first of their range (on loopback hosts, one
    # machine, the second would have had to take another).
    assert [t["port"] for t in tasks] == [TF_PORTS[0]] * 2
    assert_each_task_names_its_own_host(cluster, tasks)
    chief = next(t for t in tasks if t["index"] == 0)
    assert_points_lines_and_model_arrived(cluster, job, chief)


def test_parameter_server_with_chief_workers_and_ps_across_hosts(netns_cluster) -> None:
    cluster = netns_cluster(4)
    config = {"epochs": 2, "per_replica_batch": 32, "steps_per_epoch": 20}
    # Each ps would write its variables at the chief's checkpoint path on its own disk: these hosts share no folder.
    refused = cluster.user.post(
        f"{cluster.plane.web_url}/api/jobs/",
        json={"name": "ps", "strategy": "parameter_server", "builtin": "digits_mlp", "builtin_config": config,
              "workers": 2, "ps": 1, "devices_per_worker": 1},
        timeout=30,
    )  # fmt: skip
    assert refused.status_code == 400 and "no shared folder" in refused.json()["builtin_config.checkpoint"][0]

    job_id = submit(cluster, "parameter_server", {**config, "checkpoint": False}, workers=2, ps=1, devices_per_worker=1)
    job = wait_for_job(cluster, job_id)

    assert job.state == "succeeded", why(cluster, job)
    tasks = tasks_of(cluster, job_id)
    assert {(t["type"], t["index"]) for t in tasks} == {("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)}
    assert len({t["host"] for t in tasks}) >= 2, tasks
    assert_each_task_names_its_own_host(cluster, tasks)
    chief = next(t for t in tasks if t["type"] == "chief")
    assert_points_lines_and_model_arrived(cluster, job, chief)
    for task in tasks:  # the servers' own lines, from inside their namespaces, name the address they served on
        if task["type"] != "chief":
            serving = f"serving on {task['address']}:{task['port']}"
            wait_until(lambda task=task, serving=serving: serving in log_text(task["id"]), 60, what=serving)


def test_a_host_whose_cable_is_pulled_goes_offline_and_the_gang_restarts_on_the_hosts_left(netns_cluster) -> None:
    cluster = netns_cluster(3)  # two for the gang, one spare
    config = {"epochs": 8, "per_replica_batch": 32, "steps_per_epoch": 30}
    job_id = submit(cluster, "multi_worker_mirrored", config, workers=2, devices_per_worker=1)
    wait_for_job(cluster, job_id, ("running",), timeout=300)
    first = tasks_of(cluster, job_id)
    wait_until(
        lambda: MetricPoint.objects.using(DB).filter(job_id=job_id, phase="epoch_end", name="loss").exists(),
        300,
        what="an epoch done before the cable is pulled",
    )
    victim = next(t for t in first if t["index"] == 1)["host"]

    cluster.plane.network.cut(cluster.hosts[victim])  # the link down: its agent and its TF process run on, unreachable

    wait_until(
        lambda: Host.objects.using(DB).get(name=victim).status == HostStatus.OFFLINE,
        120,
        what=f"{victim} marked offline",
    )
    job = wait_for_job(cluster, job_id)
    assert job.state == "succeeded", why(cluster, job)
    assert job.attempt == 2 and job.restart_reason.startswith(f"host {victim} went offline"), job.restart_reason
    second = tasks_of(cluster, job_id)
    assert {(t["type"], t["index"]) for t in second} == {("worker", 0), ("worker", 1)}
    assert victim not in {t["host"] for t in second}
    assert_each_task_names_its_own_host(cluster, second)
    assert Host.objects.using(DB).get(name=victim).status == HostStatus.OFFLINE

    # The cable back: the host comes back online, and nothing of the attempt that is over runs on it (its worker,
    # cut off, exited when its peer was gone, or its agent ended it) nor holds its port: its exit was reported.
    stale = Task.objects.using(DB).get(job_id=job_id, attempt=1, host__name=victim)
    cluster.plane.network.mend(cluster.hosts[victim])
    wait_until(
        lambda: Host.objects.using(DB).get(name=victim).status == HostStatus.ONLINE, 120, what=f"{victim} back online"
    )
    wait_until(
        lambda: stale.pid not in cluster.plane.network.pids(cluster.hosts[victim]),
        120,
        what=f"the stale task's process {stale.pid} on {victim} to end (see test-artifacts/netns-agent-{victim}.log)",
    )
    wait_until(
        lambda: Task.objects.using(DB).get(pk=stale.pk).state not in ACTIVE_TASK_STATES,
        120,
        what=f"the stale task on {victim} to be over",
    )
