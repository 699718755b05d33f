"""The job page's panels beyond the charts: key facts, artifacts with download links, the live log tail, the task
table's restarts and pace column, and the live partial telling htmx to stop polling once the job is over."""

from __future__ import annotations

import pytest
from django.utils import timezone

from dashboard.page_data import LOG_TAIL_LINES, log_cursor
from orchestrator.models import Job, JobArtifact, Task, TaskLogLine
from tests import factories

pytestmark = pytest.mark.django_db


def a_job(owner, **fields) -> Job:
    cluster = factories.cluster()
    defaults = {"name": "mnist", "strategy": "multi_worker_mirrored", "program_kind": "script", "workers": 2}
    return Job.objects.create(owner=owner, cluster=cluster, **{**defaults, **fields})


def test_it_shows_the_key_facts_the_chief_reported(client, alice):
    job = a_job(
        alice,
        state="running",
        attempt=2,
        restarts=1,
        max_restarts=3,
        facts={
            "strategy": "MultiWorkerMirroredStrategy",
            "replicas_in_sync": 4,
            "global_batch": 128,
            "per_replica_batch": 32,
            "machine_batch": 64,
            "per_device_batch": 32,
            "base_learning_rate": 0.001,
            "effective_learning_rate": 0.004,
            "scale_lr": "linear",
            "warmup_epochs": 1.0,
            "checkpoint_dir": "/shared/job-1/checkpoints",
        },
    )
    client.force_login(alice)

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    assert "<dt>Replicas in sync</dt><dd>4</dd>" in page
    # Batch sizes and the learning rate as the runtime used them, in the asked-and-used table (a script given no
    # hyperparameters: nothing asked).
    for key, used in [("global_batch", "128"), ("machine_batch", "64"), ("per_device_batch", "32")]:
        assert f'<tr data-fact="{key}"><th scope="row">' in page
        assert f'<td class="asked">—</td><td class="used">{used}</td>' in page
    assert '<td class="asked">—</td><td class="used">0.004</td>' in page
    assert '<td class="used">1 epoch</td>' in page
    assert "<dd>/shared/job-1/checkpoints</dd>" in page
    assert "<dt>Restarts</dt><dd>1 of 3 allowed</dd>" in page


def test_artifacts_and_metrics_have_download_links(client, alice):
    job = a_job(alice, state="succeeded")
    JobArtifact.objects.create(job=job, name="model.keras", sha256="0" * 64, size=2048, content=b"x" * 2048)
    client.force_login(alice)

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    assert f'<a href="/api/jobs/{job.pk}/artifacts/model.keras/" download>model.keras</a> (2.0\xa0KB)' in page
    assert f'href="/api/jobs/{job.pk}/metrics-csv/"' in page


def test_the_log_tail_shows_the_last_lines_of_a_task_escaped_and_numbered_for_the_socket(client, alice):
    job = a_job(alice, state="running", attempt=1)
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, state="running")
    TaskLogLine.objects.bulk_create(
        TaskLogLine(task=task, seq=i, stream="stdout", text=f"line {i}") for i in range(1, 101)
    )
    TaskLogLine.objects.create(task=task, seq=101, stream="stderr", text="<script>alert(1)</script>")
    client.force_login(alice)

    tail = client.get(f"/jobs/{job.pk}/log-tail/?task={task.pk}").content.decode()
    page = client.get(f"/jobs/{job.pk}/").content.decode()

    assert ">line 41<" not in tail and ">line 42<" in tail and ">line 100<" in tail  # the last 60 lines
    assert "<script>alert(1)</script>" not in tail
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in tail
    assert 'data-seq="100">line 100<' in tail  # the socket's later lines are kept once by their seq
    assert "hx-trigger" not in tail and "hx-trigger" not in page  # no polling: the socket brings new lines
    assert f'id="log-tab-{task.pk}"' in tail and 'aria-pressed="true"' in tail
    assert f'href="/api/jobs/{job.pk}/logs/{task.pk}/?download=1"' in tail
    assert 'id="log-tail"' in page and "line 100" in page
    assert 'data-log-cursor="101"' in page  # the socket sends this task's lines after it (`log_since`)


@pytest.mark.parametrize(
    ("after", "seqs", "cursor"),
    [
        (None, [4, 5, 6], 6),  # a fresh tail starts where it starts
        (3, [4, 5, 6], 6),
        (3, [4, 6], 4),  # 5 commits later: the cursor waits below it
        (4, [5, 6], 6),  # ... and moves on once it came
        (None, list(range(100, 100 + LOG_TAIL_LINES)), 99 + LOG_TAIL_LINES),
        (10, list(range(100, 100 + LOG_TAIL_LINES)), 99 + LOG_TAIL_LINES),  # a full tail: older lines are never sent
        (10, [100, 101], 10),  # a short read above a gap: the gap may still fill
    ],
)
def test_the_log_cursor_stops_below_a_line_still_to_come(after, seqs, cursor):
    assert log_cursor(after, seqs) == cursor


def test_the_log_tail_of_a_task_without_output_says_so(client, alice):
    job = a_job(alice, state="succeeded", attempt=1, finished_at=timezone.now() - timezone.timedelta(minutes=5))
    Task.objects.create(job=job, attempt=1, type="worker", index=0, state="succeeded")
    client.force_login(alice)

    tail = client.get(f"/jobs/{job.pk}/log-tail/").content.decode()

    assert "hx-trigger" not in tail
    assert "No output yet." in tail


def test_the_log_tail_of_another_users_job_is_not_found(client, alice, bob):
    job = a_job(alice, state="running", attempt=1)
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0)
    client.force_login(bob)

    assert client.get(f"/jobs/{job.pk}/log-tail/?task={task.pk}").status_code == 404
    assert client.get(f"/jobs/{job.pk}/log-tail/").status_code == 404


def test_the_task_table_has_restarts_and_a_pace_cell_per_task(client, alice):
    job = a_job(alice, state="running", attempt=3, max_restarts=5)
    task = Task.objects.create(job=job, attempt=3, type="worker", index=1, state="running", restarts=2)
    client.force_login(alice)

    partial = client.get(f"/jobs/{job.pk}/live/")

    html = partial.content.decode()
    assert partial.status_code == 200
    assert f'data-task-id="{task.pk}"' in html
    assert "<th>Restarts</th>" in html and '<td class="restarts">2</td>' in html
    assert '<td class="pace">' in html


def test_the_live_partial_of_a_finished_job_shows_its_end(client, alice):
    job = a_job(alice, state="succeeded", attempt=1)
    client.force_login(alice)

    response = client.get(f"/jobs/{job.pk}/live/")

    assert response.status_code == 200
    assert 'id="job-state">succeeded<' in response.content.decode()


def test_the_job_page_of_a_job_not_placed_yet_polls_nothing(client, alice):
    job = a_job(alice, state="queued")
    client.force_login(alice)

    tail = client.get(f"/jobs/{job.pk}/log-tail/?task=oops").content.decode()

    assert "No task has been placed yet." in tail
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "hx-trigger" not in page  # its socket brings the tasks once they are placed


def test_the_log_panel_can_show_an_earlier_placements_task_but_no_other_jobs(client, alice):
    job = a_job(alice, state="running", attempt=2)
    old = Task.objects.create(job=job, attempt=1, type="worker", index=0, state="failed")
    Task.objects.create(job=job, attempt=2, type="worker", index=0, state="running")
    TaskLogLine.objects.create(task=old, seq=1, stream="stderr", text="boom")
    other = a_job(alice, state="running", attempt=1)
    foreign = Task.objects.create(job=other, attempt=1, type="worker", index=0)
    TaskLogLine.objects.create(task=foreign, seq=1, stream="stdout", text="someone else's line")
    client.force_login(alice)

    mine = client.get(f"/jobs/{job.pk}/log-tail/?task={old.pk}").content.decode()
    crossed = client.get(f"/jobs/{job.pk}/log-tail/?task={foreign.pk}").content.decode()

    assert "(placement 1)" in mine and "boom" in mine
    assert "someone else" not in crossed


def test_chart_names_mark_only_earlier_placements_even_when_the_job_was_placed_after_it_was_read(alice):
    from dashboard.page_data import task_names as _task_names

    job = a_job(alice, state="queued", attempt=0)  # what the page read, just before the scheduler placed it
    first = Task.objects.create(job=job, attempt=1, type="worker", index=0)
    assert _task_names(job) == {first.pk: "worker 0"}
    again = Task.objects.create(job=job, attempt=2, type="worker", index=0)
    assert _task_names(job) == {first.pk: "worker 0 (placement 1)", again.pk: "worker 0"}
