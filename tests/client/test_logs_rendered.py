"""`tfdash logs` prints a real tf_keras fit's output with each epoch's progress bar at its last state, and `--raw`
prints it as the task wrote it, byte for byte (the API's `raw=1`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contracts.protocol import TASK_LOGS
from orchestrator.metrics import ingest
from orchestrator.models import Job, Task
from tests import factories
from tests.client.test_log_escapes import run_cli
from tests.support.wire import sealed

pytestmark = pytest.mark.django_db(transaction=True)  # each WSGI request closes the connection at its end

FIXTURE = Path(__file__).parents[1] / "contracts" / "fixtures" / "tf_keras_fit_verbose1.stdout"


@pytest.fixture
def fitted(alice: Any) -> Job:
    """A job whose worker 0 printed a real tf_keras fit's output, stored through the ingest as its host sends it."""
    host, token = factories.host("fit-0")
    job = Job.objects.create(owner=alice, cluster=host.cluster, name="fit", strategy="mirrored", workers=1, attempt=1)
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=host, state="running")
    lines = FIXTURE.read_bytes().decode().split("\n")[:-1]
    body = {"task_id": task.pk, "attempt": 1, "lines": [[seq, "stdout", text] for seq, text in enumerate(lines)]}
    ingest.store_reports([(TASK_LOGS, sealed(host.name, token, TASK_LOGS, body))])
    return job


def test_logs_print_each_bar_at_its_last_state(alice, fitted, monkeypatch):
    printed = run_cli(alice, monkeypatch, "logs", str(fitted.pk), "--task", "worker:0")

    assert printed.splitlines() == [
        "Epoch 1/2",
        "70/70 [==============================] - 1s 2ms/step - loss: 12.6202 - mae: 3.4565",
        "Epoch 2/2",
        "70/70 [==============================] - 0s 1ms/step - loss: 4.8867 - mae: 2.0863",
    ]


def test_raw_prints_the_fit_as_written(alice, fitted, monkeypatch):
    printed = run_cli(alice, monkeypatch, "logs", str(fitted.pk), "--task", "worker:0", "--raw")

    assert printed.encode() == FIXTURE.read_bytes()
