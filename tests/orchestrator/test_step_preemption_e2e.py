"""Issue 46: a MultiWorkerMirrored job preempted mid-epoch loses at most a step. Real agents and TensorFlow
processes on two local hosts sharing a folder: the preemption's stop SIGTERMs each worker, TensorFlow saves at the
next step every worker agrees on and exits 42 within the grace, and the job, placed again, goes on at the step after
the saved one; its story says "resumed at epoch E, step S"."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from orchestrator.models import Host, Job, JobEvent, MetricPoint, PriorityClass, Task
from orchestrator.scheduler import queueing
from tests.orchestrator.test_jobs_e2e import log_text, wait_for_job
from tests.orchestrator.test_preemption_e2e import speaker, submit
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 400  # long epochs (seconds each on 2 cores), so the preemption lands inside one
LOW_RUN = {"epochs": 3, "per_replica_batch": 32, "steps_per_epoch": STEPS}
SAVED = re.compile(r"stopped by SIGTERM: saved a backup after epoch (\d+), step (\d+) \(its last completed\)")


@pytest.fixture
def two_hosts(cluster_sharing_a_folder):  # type: ignore[no-untyped-def]
    cluster = cluster_sharing_a_folder(2, "step", 29700)
    Host.objects.filter(cluster=cluster).update(cpu_slots=1)  # a device each: two 2-worker jobs cannot run together
    # The grace only bounds the wait: TensorFlow exits by itself once it has saved (a step and a save: ~1.5 s here).
    cluster.stop_grace_s = 60
    cluster.save(update_fields=["stop_grace_s"])
    return cluster


def train_steps(task: Task) -> list[int]:
    return list(MetricPoint.objects.filter(task=task, phase="train", name="loss").values_list("step", flat=True))


def test_a_job_preempted_mid_epoch_resumes_at_the_step_after_its_last_completed_one(api: APIClient, two_hosts, alice):  # type: ignore[no-untyped-def]
    queueing.standard_classes_if_none()
    PriorityClass.objects.get(name="high").users.add(alice)
    PriorityClass.objects.filter(name="low").update(min_run_s=0)  # no minimum run: preempted within its epoch 2
    low_id = submit(api, "low, long epochs", "low", LOW_RUN)
    wait_for_job(low_id, ("running",), timeout=90)
    first = speaker(low_id, 1)
    wait_until(
        lambda: MetricPoint.objects.filter(task=first, phase="train", epoch__gte=2).exists(),
        timeout=180,
        what="a step of epoch 2 reported",
    )

    high_id = submit(api, "high, urgent", "high", {"epochs": 1, "per_replica_batch": 32, "steps_per_epoch": 5})

    assert wait_for_job(high_id, timeout=180).state == "succeeded"
    low = wait_for_job(low_id, timeout=300)
    second = speaker(low_id, 2)
    assert low.state == "succeeded", (low.reason, log_text(second)[-2000:])
    assert (low.preemptions, low.restarts, low.attempt) == (1, 0, 2)
    # Every worker of the first attempt saved and exited by itself (TensorFlow's 42), none was SIGKILLed.
    codes = set(Task.objects.filter(job_id=low_id, attempt=1).values_list("exit_code", flat=True))
    assert codes == {42}, codes
    said = wait_until(lambda: SAVED.search(log_text(first)), timeout=30, what="the saved step in worker 0's log")
    epoch, step = int(said.group(1)), int(said.group(2))  # counted from 1: the last step done before the stop
    done = (epoch - 1) * STEPS + step
    assert max(train_steps(first)) <= done  # nothing it reported is lost
    # The second attempt starts at the step after it: at most the step in flight at the signal was redone.
    epochs_done, steps_done = divmod(done, STEPS)  # (a save at an epoch's last step goes on with the next epoch)
    facts = Job.objects.get(pk=low_id).facts
    assert (facts["resumed_from_epoch"], facts["resumed_from_step"]) == (epochs_done, steps_done)
    assert min(train_steps(second)) > done
    resumed = JobEvent.objects.get(job=low, kind="resumed").text
    print(f"saved after epoch {epoch}, step {step}; last reported step {max(train_steps(first))}; {resumed}")
    at = f"epoch {epochs_done + 1}" + (f", step {steps_done + 1}" if steps_done else "")
    assert resumed.startswith(f"resumed at {at} on step-"), resumed
