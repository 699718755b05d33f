"""The TensorBoard export: a finished job's points, read back by TensorBoard's own reader, are the metrics API's."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest
from rest_framework.test import APIClient
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from orchestrator.metrics import tensorboard
from orchestrator.models import Job, MetricPoint, Task
from tests import factories
from tests.support.streaming import streamed

pytestmark = pytest.mark.django_db


def as_user(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def finished(alice):
    job = Job.objects.create(
        owner=alice, cluster=factories.cluster(), name="tb", strategy="parameter_server", program_kind="script",
        workers=1, ps=1, state="succeeded", attempt=2,
    )  # fmt: skip
    chief1 = Task.objects.create(job=job, attempt=1, type="chief", index=0, state="lost")
    chief2 = Task.objects.create(job=job, attempt=2, type="chief", index=0, state="succeeded")
    worker = Task.objects.create(job=job, attempt=2, type="worker", index=0, state="killed", restart=1)
    points = []
    for task, offset in ((chief1, 0.0), (chief2, 100.0), (worker, 200.0)):
        for step in range(1, 8):  # more than one page of each series (PAGE_POINTS is 3 here)
            points.append(("train", "loss", step, 1.0 / (step + offset) + 1e-12, task))
            points.append(("train", "accuracy", step, 0.1 * step + 1e-9, task))
        points.append(("epoch_end", "val_loss", 7, 0.123456789012345, task))
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, task=task, phase=phase, name=name, step=step, epoch=1, value=value, ts=1.7e9 + step / 3)
        for phase, name, step, value, task in points
    )
    return job


def extract(body: bytes, into: Path) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
        names = archive.getnames()
        assert all(not name.startswith("/") and ".." not in name.split("/") for name in names)
        archive.extractall(into)  # noqa: S202 - names checked above
    return names


def read_back(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every tag of a run as TensorBoard reads it: (step, wall time, value)."""
    accumulator = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    return {
        tag: [(e.step, e.wall_time, tensor_util.make_ndarray(e.tensor_proto).item()) for e in accumulator.Tensors(tag)]
        for tag in accumulator.Tags()["tensors"]
    }


def test_it_reads_back_as_the_metrics_api_gives_them(alice, finished, tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard, "PAGE_POINTS", 3)
    client = as_user(alice)

    response = client.get(f"/api/jobs/{finished.pk}/tensorboard/")

    assert response.status_code == 200
    assert response["Content-Type"] == "application/gzip"
    assert f'filename="job{finished.pk}-tensorboard.tar.gz"' in response["Content-Disposition"]
    names = extract(streamed(response), tmp_path)
    root = f"job{finished.pk}"
    runs = sorted({name.rsplit("/", 1)[0] for name in names})
    assert runs == [
        f"{root}/chief-0.attempt2/epoch_end",
        f"{root}/chief-0.attempt2/train",
        f"{root}/chief-0/epoch_end",
        f"{root}/chief-0/train",
        f"{root}/worker-0.attempt2.restart1/epoch_end",
        f"{root}/worker-0.attempt2.restart1/train",
    ]
    assert all("events.out.tfevents." in name.rsplit("/", 1)[1] for name in names)

    api = client.get(f"/api/jobs/{finished.pk}/metrics/").json()
    assert not api["more"]
    tasks = {t.pk: tensorboard.task_run_name(t.type, t.index, t.attempt, t.restart) for t in finished.tasks.all()}
    expected: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
    for _id, task, phase, name, step, _epoch, value, ts in api["points"]:
        expected.setdefault((f"{tasks[task]}/{phase}", name), []).append((step, ts, value))
    got = {
        (run.removeprefix(f"{root}/"), tag): series for run in runs for tag, series in read_back(tmp_path / run).items()
    }
    assert got.keys() == expected.keys()
    for key, series in expected.items():
        # Exactly the stored values (float64), steps and wall times (TensorBoard keeps wall time as a double).
        assert got[key] == sorted(series), key


def test_a_job_with_no_points_is_an_empty_archive(alice, tmp_path):
    job = Job.objects.create(
        owner=alice, cluster=factories.cluster(), name="empty", strategy="mirrored", program_kind="script"
    )
    response = as_user(alice).get(f"/api/jobs/{job.pk}/tensorboard/")
    assert response.status_code == 200
    assert extract(streamed(response), tmp_path) == []


def test_another_users_job_is_not_found(bob, finished):
    assert as_user(bob).get(f"/api/jobs/{finished.pk}/tensorboard/").status_code == 404


# Phases an agent may report (free text, cut to 10 characters by the ingest): a way out of the folder, an absolute
# path, a terminal escape, non-ASCII, a lone dot, and the usual one.
HOSTILE_PHASES = ["../../etc/", "/etc/x", "t\x1b]0;pwn\x07", "фаза", "..", ".", "train"]


def test_archive_member_names_use_a_safe_alphabet_whatever_the_phase(alice, tmp_path):
    job = Job.objects.create(
        owner=alice, cluster=factories.cluster(), name="tb", strategy="mirrored", program_kind="script", attempt=1
    )
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, state="succeeded")
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, task=task, phase=phase, name="loss", step=1, epoch=1, value=float(i), ts=1.7e9)
        for i, phase in enumerate(HOSTILE_PHASES)
    )

    names = extract(streamed(as_user(alice).get(f"/api/jobs/{job.pk}/tensorboard/")), tmp_path / "out")

    for name in names:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*", name), name
        assert not any(part.startswith(".") for part in name.split("/")), name
    runs = sorted({name.rsplit("/", 1)[0] for name in names})
    assert len(runs) == len(HOSTILE_PHASES)  # each phase its own run: none merged with another
    assert f"job{job.pk}/worker-0/train" in runs
    # Every file landed inside the folder it was unpacked into, and each phase's value is there to read.
    files = [path for path in (tmp_path / "out").rglob("*") if path.is_file()]
    assert len(files) == len(HOSTILE_PHASES)
    assert sorted(read_back(path.parent)["loss"][0][2] for path in files) == [float(i) for i in range(len(runs))]
    assert not (tmp_path / "etc").exists()
