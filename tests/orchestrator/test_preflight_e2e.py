"""A preflight for real, agents and TensorFlow on two local hosts of one device each: a 2-worker MultiWorkerMirrored
job whose script fails at import is refused by its preflight (one process, one device) within its bound, and never
had a task of its own: it never held two hosts' devices. A good script's preflight stops its fit after its step bound,
passes, and the job then runs on both hosts."""

from __future__ import annotations

import time

import pytest

from orchestrator.core import preflight
from orchestrator.models import Host, Job, JobEvent, Task
from tests.orchestrator.test_jobs_e2e import cluster_of, log_text, submit, wait_for_job  # noqa: F401 - a fixture
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_script_failing_at_import_is_refused_by_its_preflight_and_a_good_one_runs(api, cluster_of) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    hosts = cluster_of(2, first_port=27400)
    Host.objects.filter(pk__in=[h.pk for h in hosts]).update(cpu_slots=1)  # a 2-worker gang needs both hosts
    shape = {"strategy": "multi_worker_mirrored", "workers": 2, "preflight": "true"}

    began = time.monotonic()
    bad_id = submit(api, "fails_at_import.py", **shape)
    bad = wait_for_job(bad_id, timeout=preflight.TIME_LIMIT_S + 30)
    refused_in = time.monotonic() - began

    run = Job.objects.get(preflight_for_id=bad_id)
    print(f"submitted -> refused by its preflight in {refused_in:.1f} s")
    assert bad.state == "failed" and bad.reason.startswith(f"refused by its preflight #{run.pk}: "), bad.reason
    assert refused_in < preflight.TIME_LIMIT_S
    assert not Task.objects.filter(job_id=bad_id).exists()  # it never held a device, let alone two hosts'
    (task,) = Task.objects.filter(job=run)  # its preflight: one process on one device
    assert run.state == "failed" and len(task.devices) == 1
    assert bad.preflight["state"] == preflight.FAILED and bad.diagnosis["preflight"] == run.pk
    assert "tfdash_preflight_no_such_module" in " ".join([bad.diagnosis["message"], *bad.diagnosis["evidence"]])

    good_id = submit(api, "mwms_fit.py", **shape, args="--epochs 1 --batch-size 16")  # 128 steps an epoch
    good = wait_for_job(good_id, timeout=300)

    good_run = Job.objects.get(preflight_for_id=good_id)
    assert good.state == "succeeded", good.reason
    assert good_run.state == "succeeded" and good.preflight["state"] == preflight.PASSED
    passed = JobEvent.objects.filter(job=good, kind="preflight", text__startswith=f"preflight #{good_run.pk} passed")
    assert passed.exists()
    (checked,) = Task.objects.filter(job=good_run)
    wait_until(lambda: "tfdash: preflight: fit stopped after 20 steps" in log_text(checked), 30,
               what="the step bound's line")  # fmt: skip
    assert Task.objects.filter(job=good).count() == 2 and good.placed_at >= good_run.finished_at  # placed after it
