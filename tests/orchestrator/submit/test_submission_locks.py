"""A submission's lock on its owner (orchestrator/submit/submission.py: two submissions of one user must not both
take the last place) must not stand in a scheduler pass's way. A pass holds its cluster's row and updates each job it
places more than once (its state and tasks, then its task uid slot); PostgreSQL then checks every foreign key of that
job row again at COMMIT, its owner's included, while a submission's own COMMIT checks its new job's cluster, which
waits for the pass. With the owner locked FOR UPDATE the two waited for each other: "deadlock detected", and the
user's `POST /api/jobs/` answered 500 (two submissions back to back on one cluster, 4 times in 5)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from orchestrator.models import Job, JobState
from orchestrator.scheduler import scheduling
from orchestrator.submit import submission
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_pass_placing_the_owners_job_commits_while_a_submission_holds_the_owner(alice):
    host, _token = factories.host(cluster_name="lab", port_min=26500)
    host.cpu_slots, host.status = 2, "online"
    host.save()
    queued = Job.objects.create(
        owner=alice, cluster=host.cluster, name="j", strategy="mirrored", program_kind="builtin",
        builtin="digits_mlp", workers=1, devices_per_worker=1,
    )  # fmt: skip
    outcome: dict[str, BaseException | None] = {}

    def run_pass() -> None:
        try:
            with connection.cursor() as cursor:
                # Waiting is failing here: the old lock held this pass until the submission's transaction ended.
                cursor.execute("SET lock_timeout = '3s'")
            scheduling.schedule_cluster(host.cluster_id)
            outcome["pass"] = None
        except BaseException as exc:  # handed to the test's thread
            outcome["pass"] = exc
        finally:
            connection.close()

    with transaction.atomic():
        submission.lock_owner_and_count_active(alice.pk)  # as a submission of alice's holds it until its COMMIT
        worker = threading.Thread(target=run_pass)
        worker.start()
        worker.join(60)
    assert not worker.is_alive(), "the pass never ended"
    assert outcome["pass"] is None, f"the pass waited for the submission's lock on its owner: {outcome['pass']!r}"
    queued.refresh_from_db()
    assert queued.state == JobState.STARTING, queued.reason
    assert queued.task_uid_slot == 0
