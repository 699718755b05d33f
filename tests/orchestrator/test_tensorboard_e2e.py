"""TensorBoard end to end: a ParameterServer script using the Keras TensorBoard callback and tf.summary under
TFDASH_TENSORBOARD_DIR succeeds, its event files come back as an artifact, and the job's TensorBoard export reads back
(with TensorBoard's own reader) as the metrics API gives the points. Real orchestrator, agent and TF processes."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from orchestrator.metrics import tensorboard
from orchestrator.models import Host, HostStatus, Job, JobArtifact
from tests import factories
from tests.support.processes import wait_until
from tests.support.streaming import streamed

pytestmark = pytest.mark.django_db(transaction=True)

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"


def unpack(content: bytes, into: Path) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(content), mode="r:gz") as archive:
        names = archive.getnames()
        assert all(not n.startswith("/") and ".." not in n.split("/") for n in names)
        archive.extractall(into)  # noqa: S202 - names checked above
    return names


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of a run as TensorBoard's reader sees it (tf.summary writes tensors, Keras too)."""
    accumulator = event_accumulator.EventAccumulator(str(run), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    found: dict[str, list[tuple[int, float]]] = {}
    for tag in accumulator.Tags()["tensors"]:
        values = [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in accumulator.Tensors(tag)]
        if all(value.dtype.kind == "f" and value.size == 1 for _, value in values):  # not Keras's model config text
            found[tag] = [(step, float(value)) for step, value in values]
    return found


def test_a_ps_scripts_summaries_are_collected_and_the_export_matches_the_api(api, orchestrator, start_agent, tmp_path):
    host, token = factories.host("tb-0", port_min=27300)
    Host.objects.filter(pk=host.pk).update(port_max=27309, cpu_slots=2)
    start_agent(host.name, token)
    wait_until(lambda: Host.objects.filter(status=HostStatus.ONLINE).count() == 1, 30, what="the host online")
    script = (PROGRAMS / "ps_tensorboard.py").read_bytes()
    response = api.post(
        "/api/jobs/",
        {"name": "ps-tb", "script": SimpleUploadedFile("ps_tensorboard.py", script), "strategy": "parameter_server",
         "workers": 1, "ps": 1, "args": "--epochs 2 --steps 4"},
        format="multipart",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]

    job = wait_until(
        lambda: (j := Job.objects.get(pk=job_id)).state in ("succeeded", "failed", "cancelled") and j, 180,
        interval=0.25, what="the job to end",
    )  # fmt: skip
    assert job.state == "succeeded", job.reason

    # The chief's own summaries, collected when it ended: Keras's train/ run and the tf.summary writer's custom/.
    artifact = wait_until(
        lambda: JobArtifact.objects.filter(job=job, name="tensorboard-chief-0.tar.gz").first(), 30,
        what="the chief's summaries",
    )  # fmt: skip
    listed = {a["name"] for a in api.get(f"/api/jobs/{job_id}/artifacts/").json()}
    assert "tensorboard-chief-0.tar.gz" in listed
    mine = tmp_path / "mine"
    names = unpack(bytes(artifact.content), mine)
    assert any(n.startswith("train/events.out.tfevents.") for n in names), names
    assert scalars(mine / "custom")["lr_seen"] == [(0, pytest.approx(0.1)), (1, pytest.approx(0.2))]
    assert [step for step, _ in scalars(mine / "train")["epoch_loss"]] == [0, 1]

    # The export of what the product stored (the injected callback's points) reads back as the API gives them.
    wait_until(lambda: Job.objects.get(pk=job_id).points_stored > 0, 30, what="points stored")
    export = tmp_path / "export"
    unpack(streamed(api.get(f"/api/jobs/{job_id}/tensorboard/")), export)
    points = api.get(f"/api/jobs/{job_id}/metrics/").json()["points"]
    runs = {t.pk: tensorboard.task_run_name(t.type, t.index, t.attempt, t.restart) for t in job.tasks.all()}
    expected: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for _id, task, phase, name, step, _epoch, value, _ts in points:
        expected.setdefault((f"{runs[task]}/{phase}", name), []).append((step, value))
    assert expected, "the injected callback reported nothing"
    for (run, name), series in expected.items():
        assert scalars(export / f"job{job_id}" / run)[name] == sorted(series), (run, name)
