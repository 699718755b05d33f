"""Writers of job and task rows take them in one order (orchestrator/models/row_locks.py), so two of them never wait
on each other in a circle: PostgreSQL would abort one as a deadlock (a user's cancel answered 500 in CI while the
ingest stored its job's facts). Each test holds a lock the way one writer does, lets the other run into it, and checks
the other holds nothing the first still needs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from contracts.protocol import TASK_LOGS, TASK_METRICS
from orchestrator.identity import tokens
from orchestrator.jobs import dispatch, hangs, lifecycle
from orchestrator.metrics import ingest
from orchestrator.models import Job, JobState, Task, TaskState
from tests import factories
from tests.orchestrator.metrics.conftest import envelope
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class Beside:
    """`work` run in a thread with its own database session (PostgreSQL gives it up after the database's lock_timeout,
    10 s, of waiting for a lock)."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self._pid: list[int] = []
        self._outcome: list[tuple[str, Any]] = []
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], Any]) -> None:
        try:
            connection.ensure_connection()
            self._pid.append(connection.connection.info.backend_pid)
            self._outcome.append(("ok", work()))
        except BaseException as exc:  # handed to the test's thread by result()
            self._outcome.append(("raised", exc))
        finally:
            connection.close()

    def wait_blocked(self) -> None:
        """Until its session waits for a lock another session holds (PostgreSQL's own view of it)."""

        def blocked() -> bool:
            # pg_blocking_pids, not pg_stat_activity: that is read once per transaction, and the test's is open.
            with connection.cursor() as cursor:
                cursor.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", [self._pid[0] if self._pid else 0])
                return bool(cursor.fetchone()[0]) or bool(self._outcome)

        wait_until(blocked, timeout=60, what="the other writer to wait for a lock")
        assert not self._outcome, f"the other writer finished without waiting: {self._outcome}"

    def result(self) -> Any:
        self._thread.join(timeout=60)
        assert self._outcome, "the other writer never finished"
        kind, value = self._outcome[0]
        if kind == "raised":
            raise value
        return value


def test_a_cancel_and_an_ingest_batch_of_the_same_jobs_facts_and_lines_both_go_through(django_user_model):
    owner = django_user_model.objects.create_user("alice", password="pw-alice-123")
    tasks = factories.gang(owner, 2)
    job, host = tasks[0].job, tasks[0].host
    token = tokens.issue(host)  # the agent's, anew: the gang's host keeps none
    host.save()
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, attempt=1)
    Task.objects.filter(job=job).update(state=TaskState.RUNNING, attempt=1)
    now = time.time()
    facts = {"kind": "facts", "ts": now, "facts": {"global_batch": 64}}  # worker 0's: the job's facts too
    reports = [
        (TASK_METRICS, envelope(host, token, {"task_id": tasks[0].pk, "attempt": 1, "events": [facts]})),
        (TASK_LOGS, envelope(host, token, {"task_id": tasks[1].pk, "attempt": 1, "lines": [[0, "stdout", "hi"]]})),
    ]

    with transaction.atomic():
        Job.objects.select_for_update().get(pk=job.pk)  # where a cancel starts
        ingesting = Beside(lambda: ingest.store_reports(reports))
        ingesting.wait_blocked()
        # The ingest waits for the job and holds none of its tasks: the cancel stops them without waiting.
        assert lifecycle.cancel(job.pk, by="alice")
    stored = ingesting.result()
    assert (stored.points, stored.lines, stored.failed) == (0, 1, [])

    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    assert set(Task.objects.filter(job=job).values_list("state", flat=True)) == {TaskState.STOPPING}
    assert Job.objects.get(pk=job.pk).facts == {"global_batch": 64}
    assert Task.objects.get(pk=tasks[1].pk).log_lines_in == 1


def seq_scans_only() -> None:
    """Plan this session's statements as over a large table (a sequential scan meets rows in the table's order; an
    index scan of a few ids meets them in id order, which would hide the order a bare UPDATE takes)."""
    with connection.cursor() as cursor:
        cursor.execute("SET enable_indexscan = off; SET enable_bitmapscan = off; SET enable_indexonlyscan = off")


def test_orders_stamped_on_tasks_take_their_rows_in_id_order(django_user_model):
    owner = django_user_model.objects.create_user("alice", password="pw-alice-123")
    first, second = factories.gang(owner, 2)
    first.detail = "moved"  # its row's new version now lies after the second's in the table
    first.save(update_fields=["detail"])

    with transaction.atomic():
        Task.objects.select_for_update().get(pk=first.pk)  # as the ingest or a lifecycle change holds it
        stamping = Beside(lambda: seq_scans_only() or dispatch._stamp([second, first]))
        stamping.wait_blocked()
        # The stamp waits for the first row and has not taken the second.
        assert list(Task.objects.select_for_update(nowait=True).filter(pk=second.pk).values_list("pk", flat=True))
    stamping.result()

    assert Task.objects.filter(pk__in=[first.pk, second.pk], ordered_at__isnull=False).count() == 2


def test_the_watchdogs_progress_marks_take_the_jobs_rows_in_id_order(django_user_model):
    owner = django_user_model.objects.create_user("alice", password="pw-alice-123")
    first, second = (factories.gang(owner, 1)[0].job for _ in range(2))
    Job.objects.filter(pk__in=[first.pk, second.pk]).update(state=JobState.RUNNING, progress_mark="")
    Job.objects.filter(pk=first.pk).update(name="moved")  # its row's new version now lies after the second's
    moved = [(second.pk, "", "points 5"), (first.pk, "", "points 7")]

    with transaction.atomic():
        Job.objects.select_for_update().get(pk=first.pk)  # as the ingest holds it, about to take the second's
        marking = Beside(lambda: seq_scans_only() or hangs._store_marks(moved, timezone.now()))
        marking.wait_blocked()
        # The marks wait for the first job's row and have not taken the second's.
        assert list(Job.objects.select_for_update(nowait=True).filter(pk=second.pk).values_list("pk", flat=True))
    marking.result()

    assert dict(Job.objects.filter(pk__in=[first.pk, second.pk]).values_list("pk", "progress_mark")) == {
        first.pk: "points 7",
        second.pk: "points 5",
    }
