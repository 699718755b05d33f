"""The verdict saved on its job by the lifecycle (real PostgreSQL, the events an agent would send applied directly):
made once the job's end commits, made again when a peer stopped after it ends or late log lines come in, never in
the way of the job's end."""

from __future__ import annotations

import pytest
from django.db import transaction

from contracts.task_messages import TaskEventKind
from orchestrator.diagnosis import store
from orchestrator.jobs import lifecycle
from orchestrator.models import Job, JobState, Task, TaskLogLine
from tests.orchestrator.jobs.test_restarts import apply, running_job, task_of

pytestmark = pytest.mark.django_db(transaction=True)

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/jobs/7/train.py", line 42, in <module>',
    "    model.fit(dataset)",
    "ValueError: bad shape (64, 10) for layer dense_1",
]
PEER = ["tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted by: worker 1 is gone"]


def say(task: Task, lines: list[str], stream: str = "stderr") -> None:
    """Log lines as the ingest stores them: the rows, and the task's count of lines taken in."""
    first = task.log_lines.count()
    TaskLogLine.objects.bulk_create(
        TaskLogLine(task=task, seq=first + i, stream=stream, text=text) for i, text in enumerate(lines)
    )
    Task.objects.filter(pk=task.pk).update(log_lines_in=first + len(lines))


def test_a_failed_job_gets_its_verdict_and_a_peer_stopped_after_it_is_listed_once_it_ends(alice):
    job = running_job(alice, max_restarts=0)
    cause, peer = task_of(job, "worker", 1), task_of(job, "worker", 0)
    say(cause, ["epoch 1/3", *TRACEBACK])

    apply(cause, TaskEventKind.EXITED, exit_code=1)

    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.diagnosis["kind"] == "user_exception"
    assert (job.diagnosis["task"], job.diagnosis["task_id"]) == (cause.label, cause.pk)
    assert (
        job.diagnosis["message"]
        == f"{cause.label} raised ValueError at train.py:42: bad shape (64, 10) for layer dense_1"
    )
    assert job.diagnosis["evidence"] == TRACEBACK
    assert job.diagnosis["peers"] == []  # worker 0 is still being stopped

    say(peer, PEER)
    apply(peer, TaskEventKind.EXITED, exit_code=-9, detail="job failed")

    job.refresh_from_db()
    assert job.diagnosis["task"] == cause.label
    assert job.diagnosis["peers"] == [
        {"task": peer.label, "task_id": peer.pk, "kind": "peer_failure",
         "message": "UnavailableError: Collective ops is aborted by: worker 1 is gone (killed by signal 9 (SIGKILL))"}
    ]  # fmt: skip


def test_a_peer_is_listed_when_it_ends_though_a_page_read_the_verdict_after_its_lines_came_in(alice):
    """The peer's end, not only new lines, makes the verdict again: a page that asked for it between the peer's last
    line and its exit (and so saved one with the peer still running and every line counted) must not hide the peer
    for good (a browser test caught its page without the peer in a full run)."""
    job = running_job(alice, max_restarts=0)
    cause, peer = task_of(job, "worker", 1), task_of(job, "worker", 0)
    say(cause, ["epoch 1/3", *TRACEBACK])
    apply(cause, TaskEventKind.EXITED, exit_code=1)
    say(peer, PEER)

    assert store.current(Job.objects.get(pk=job.pk))["peers"] == []  # as the job's page renders it meanwhile
    apply(peer, TaskEventKind.EXITED, exit_code=-9, detail="job failed")

    assert [each["task"] for each in Job.objects.get(pk=job.pk).diagnosis["peers"]] == [peer.label]


def test_current_recomputes_only_when_log_lines_came_in_since(alice):
    job = running_job(alice, max_restarts=0)
    cause = task_of(job, "worker", 1)
    say(cause, ["loading", "giving up"])
    apply(cause, TaskEventKind.EXITED, exit_code=3)
    job.refresh_from_db()
    made = job.diagnosis
    assert (made["kind"], made["message"]) == (
        "unknown",
        f"{cause.label} failed (exit code 3); its last words: giving up",
    )

    assert store.current(Job.objects.get(pk=job.pk)) == made  # nothing new: the saved one, as it was

    say(cause, ["ModuleNotFoundError: No module named 'tensorflow_addons'"])  # a late line
    later = store.current(Job.objects.get(pk=job.pk))
    assert later["kind"] == "missing_import" and later["at"] >= made["at"]
    assert Job.objects.get(pk=job.pk).diagnosis == later


def test_a_job_ended_by_its_time_limit_or_a_hang_is_judged_by_its_end(alice):
    timed = running_job(alice)
    with transaction.atomic():
        lifecycle.end_job(Job.objects.select_for_update().get(pk=timed.pk), JobState.TIMED_OUT,
                          "time limit of 60 s reached (after epoch 3)")  # fmt: skip
    verdict = Job.objects.get(pk=timed.pk).diagnosis
    assert (verdict["kind"], verdict["task"], verdict["task_id"]) == ("time_limit", "", None)
    assert verdict["message"] == (
        "The job ran into its time limit: time limit of 60 s reached (after epoch 3); the product stopped its tasks."
    )

    hung = running_job(alice)
    quiet, chatty = task_of(hung, "worker", 1), task_of(hung, "worker", 0)
    say(quiet, ["waiting for the input queue"], stream="stdout")
    say(chatty, ["step 1", "step 2"], stream="stdout")
    with transaction.atomic():
        lifecycle.end_job(Job.objects.select_for_update().get(pk=hung.pk), JobState.FAILED,
                          "no progress for 300 s (no metric point or log line)")  # fmt: skip
    verdict = Job.objects.get(pk=hung.pk).diagnosis
    assert (verdict["kind"], verdict["task"]) == ("hang", quiet.label)
    assert verdict["title"] == f"no progress for 300 s: {quiet.label} stopped reporting first"
    assert verdict["message"].endswith("its last line: waiting for the input queue")


def test_a_verdict_that_cannot_be_made_never_stops_the_job_from_ending(alice, monkeypatch):
    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("a bug in a rule")

    monkeypatch.setattr(store, "classify", broken)
    job = running_job(alice, max_restarts=0)

    apply(task_of(job, "worker", 1), TaskEventKind.EXITED, exit_code=1)

    job.refresh_from_db()
    assert (job.state, job.diagnosis) == (JobState.FAILED, {})


def test_a_job_that_succeeds_gets_no_verdict(alice):
    job = running_job(alice, strategy="mirrored", workers=1)
    apply(task_of(job, "worker", 0), TaskEventKind.EXITED, exit_code=0)
    job.refresh_from_db()
    assert (job.state, job.diagnosis, store.current(job)) == (JobState.SUCCEEDED, {}, {})
