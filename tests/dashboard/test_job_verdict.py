"""The verdict on the job page (issue 45): a failed job's Job.diagnosis above its failed task's exit code and tail,
with the cause task's log linked, the evidence in a <pre> and the peers that failed because of it collapsed; nothing
for a job without one or still running; a stored dict of the wrong shape does not break the page; and a page left
open gets the verdict when the job ends, without a reload."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from orchestrator.models import Job, Task, TaskLogLine
from tests import factories
from tests.dashboard.test_job_socket import connect, next_frame, read_history

pytestmark = pytest.mark.django_db

DIAGNOSIS = {
    "kind": "user_exception",
    "title": "worker 1 raised ValueError",
    "message": "worker 1 on node-1 raised ValueError: bad <shape> in train.py:42",
    "hint": "Fix the error at train.py:42; the other workers stopped because worker 1 did.",
    "task": "worker 1 on node-1",
    "task_id": None,  # set to the cause's id
    "evidence": ["Traceback (most recent call last):", '  File "train.py", line 42, in <module>', "ValueError: bad"],
    "peers": [],
    "at": "2026-11-27T23:00:00+00:00",
    "lines_in": 0,  # the log lines it was made from (Task.log_lines_in summed): equal, so it is not made again
}


def failed_job(owner, **diagnosis) -> tuple[Job, Task, Task]:
    """A failed two-worker job: worker 1 raised (the cause, exit 1), worker 0 failed because of it."""
    host, _token = factories.host("node-1")
    host.save()
    job = Job.objects.create(owner=owner, cluster=host.cluster, name="j", strategy="multi_worker_mirrored",
                             program_kind="script", workers=2, attempt=1, state="failed")  # fmt: skip
    peer = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=host, state="failed", exit_code=1)
    cause = Task.objects.create(job=job, attempt=1, type="worker", index=1, host=host, state="failed", exit_code=1)
    lines = ["Traceback (most recent call last):", '  File "/home/alice/train.py", line 42, in <module>',
             "ValueError: bad <shape>"]  # fmt: skip
    TaskLogLine.objects.bulk_create(
        TaskLogLine(task=cause, seq=i, stream="stderr", text=t) for i, t in enumerate(lines)
    )
    peers = [{"task": "worker 0 on node-1", "task_id": peer.pk, "kind": "peer_failure",
              "message": "UnavailableError: failed because worker 1 failed first"}]  # fmt: skip
    job.failed_task = cause
    job.diagnosis = {**DIAGNOSIS, "task_id": cause.pk, "peers": peers, **diagnosis}
    job.save()
    return job, cause, peer


def test_the_verdict_is_above_the_failed_tasks_exit_code_and_the_logs(client, alice):
    job, cause, peer = failed_job(alice)
    client.force_login(alice)

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    verdict = page.index('id="verdict"')
    assert verdict < page.index('id="failure"') < page.index('id="logs"')
    assert "Why it failed: worker 1 raised ValueError" in page
    assert "raised ValueError: bad &lt;shape&gt; in train.py:42" in page  # escaped
    assert "<strong>What to do:</strong> Fix the error at train.py:42" in page
    assert f'Cause: <a href="/jobs/{job.pk}/tasks/{cause.pk}/log/">worker 1 on node-1</a>' in page
    evidence = page[page.index('id="verdict-evidence"') :]
    assert evidence.index("Traceback (most recent call last):") < evidence.index("</pre>")
    assert "line 42, in &lt;module&gt;" in evidence
    # The peers are there, collapsed: a <details> without `open`, each peer's log linked.
    peers = page[page.index('<details class="verdict-peers"') : page.index("</details>", verdict)]
    assert peers.startswith('<details class="verdict-peers" id="verdict-peers">')
    assert "1 other task failed because of it" in peers
    assert f'<a href="/jobs/{job.pk}/tasks/{peer.pk}/log/">worker 0 on node-1</a>: UnavailableError' in peers
    # The failed task's own block stays: its exit code and tail.
    assert "worker 1 on node-1 failed with exit code 1" in page and "ValueError: bad &lt;shape&gt;" in page


def test_a_time_limit_verdict_names_no_task(client, alice):
    job, _cause, _peer = failed_job(alice, kind="time_limit", title="the job reached its time limit", task="",
                                    task_id=None, peers=[], evidence=[], hint="Raise time_limit_s.")  # fmt: skip
    Job.objects.filter(pk=job.pk).update(state="timed_out", failed_task=None)
    client.force_login(alice)

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    assert "Why it stopped: the job reached its time limit" in page and "Raise time_limit_s." in page
    assert 'id="verdict-cause"' not in page and 'id="verdict-evidence"' not in page and "verdict-peers" not in page


def test_no_verdict_for_a_job_that_runs_again_or_succeeded(client, alice):
    job, _cause, _peer = failed_job(alice)
    client.force_login(alice)

    # A job restarted after its failure runs again: the old attempt's verdict is not its state.
    Job.objects.filter(pk=job.pk).update(state="running")
    assert 'id="verdict"' not in client.get(f"/jobs/{job.pk}/").content.decode()
    Job.objects.filter(pk=job.pk).update(state="succeeded", diagnosis={}, failed_task=None)
    assert 'id="verdict"' not in client.get(f"/jobs/{job.pk}/").content.decode()


def test_a_failed_job_without_a_verdict_yet_gets_one_made_from_its_tasks(client, alice):
    job, cause, peer = failed_job(alice)
    Job.objects.filter(pk=job.pk).update(diagnosis={})  # its end's after-commit verdict has not landed
    ended = timezone.now()
    Task.objects.filter(pk=cause.pk).update(finished_at=ended - timedelta(seconds=2))
    Task.objects.filter(pk=peer.pk).update(finished_at=ended)
    client.force_login(alice)

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    assert page.index('id="verdict"') < page.index('id="failure"')
    assert "Why it failed: worker 1 on node-1 raised ValueError" in page
    made = Job.objects.get(pk=job.pk).diagnosis  # and saved
    assert (made["kind"], made["task_id"]) == ("user_exception", cause.pk)


def test_a_diagnosis_of_the_wrong_shape_does_not_break_the_page(client, alice):
    job, _cause, _peer = failed_job(alice, task_id="1/../../admin", evidence="not a list", peers=[7, {"task_id": -1}])
    client.force_login(alice)

    response = client.get(f"/jobs/{job.pk}/")

    page = response.content.decode()
    assert response.status_code == 200 and "Why it failed: worker 1 raised ValueError" in page
    assert "admin" not in page and 'id="verdict-evidence"' not in page
    assert "Cause: worker 1 on node-1</p>" in page  # named, not linked
    assert "1 other task failed because of it" in page  # the dict, without a link; the 7 left out


def test_the_jobs_list_says_why_with_the_verdicts_title_read_from_the_row(client, alice):
    job, _cause, _peer = failed_job(alice, title="worker 1 raised <ValueError>")
    Job.objects.filter(pk=job.pk).update(reason="worker 1 on node-1 exited with code 1")
    plain = Job.objects.create(owner=alice, cluster=job.cluster, name="k", strategy="mirrored", program_kind="script",
                               state="failed", reason="worker 0 exited 1")  # fmt: skip
    client.force_login(alice)

    page = client.get("/jobs/").content.decode()

    row = page[page.index(f'<tr data-job="{job.pk}"') :]
    assert '<small class="failure-reason">why: worker 1 raised &lt;ValueError&gt;</small>' in row[: row.index("</tr>")]
    row = page[page.index(f'<tr data-job="{plain.pk}"') :]
    assert '<small class="failure-reason">worker 0 exited 1</small>' in row[: row.index("</tr>")]  # none: its reason


def test_another_users_verdict_is_not_shown(client, alice, bob):
    job, _cause, _peer = failed_job(alice)
    client.force_login(bob)

    assert client.get(f"/jobs/{job.pk}/").status_code == 404


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_open_page_gets_the_verdict_when_the_job_ends(alice):
    """The job's end hints its pages; the frame they get carries the verdict, made from the tasks' log lines by the
    diagnosis store if the job's own after-commit verdict has not landed yet."""
    job, cause, peer = await sync_to_async(failed_job)(alice)

    def running() -> None:
        Job.objects.filter(pk=job.pk).update(state="running", diagnosis={}, failed_task=None)
        TaskLogLine.objects.filter(task=cause).delete()
        lines = ["Traceback (most recent call last):", '  File "/home/alice/train.py", line 42, in <module>',
                 "ValueError: bad shape"]  # fmt: skip
        TaskLogLine.objects.bulk_create(
            TaskLogLine(task=cause, seq=i, stream="stderr", text=t) for i, t in enumerate(lines)
        )
        TaskLogLine.objects.create(task=peer, seq=0, stream="stderr", text="tensorflow.python.framework.errors_impl."
                                   "UnavailableError: failed to connect to all addresses")  # fmt: skip

    await sync_to_async(running)()
    socket, connected, _ = await connect(alice, job.pk)
    assert connected
    state: list[dict] = []
    await read_history(socket, state)
    assert state[0]["type"] == "job" and 'id="verdict"' not in state[0]["html"]

    def fail() -> None:
        ended = Job.objects.get(pk=job.pk)
        ended.state, ended.failed_task, ended.reason = "failed", cause, "worker 1 on node-1 exited with code 1"
        ended.save()

    await sync_to_async(fail)()
    frame = await next_frame(socket, "job", lambda frame: frame["state"] == "failed")
    html = frame["html"]
    assert 'id="verdict"' in html and html.index('id="verdict"') < html.index('id="failure"')
    assert "ValueError" in html and "train.py:42" in html
    assert f'<a href="/jobs/{job.pk}/tasks/{cause.pk}/log/">worker 1 on node-1</a>' in html
    assert (await sync_to_async(Job.objects.get)(pk=job.pk)).diagnosis["task_id"] == cause.pk  # saved once made
    await socket.disconnect()


def test_a_verdict_that_cannot_be_made_leaves_the_page_with_the_stored_one(client, alice, monkeypatch):
    job, _cause, _peer = failed_job(alice)
    client.force_login(alice)

    def broken(_job):
        Job.objects.raw("SELECT no_such_column FROM orchestrator_job")[0]  # a database error inside

    monkeypatch.setattr("orchestrator.diagnosis.store.current", broken)
    response = client.get(f"/jobs/{job.pk}/")

    assert response.status_code == 200 and "Why it failed: worker 1 raised ValueError" in response.content.decode()
