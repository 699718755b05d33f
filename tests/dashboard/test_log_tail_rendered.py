"""The job page's live log tail (its socket's `log` frames) shows a tf_keras progress bar at its last state: the
stored lines are a real fit's stdout, with every redraw's carriage return and backspaces in them."""

from __future__ import annotations

from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from orchestrator.models import TaskLogLine
from tests.dashboard.test_job_socket import connect, make_job, read_history

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

FIXTURE = Path(__file__).parents[1] / "contracts" / "fixtures" / "tf_keras_fit_verbose1.stdout"


async def test_the_sockets_log_frame_carries_each_bar_at_its_last_state(alice):
    _host, _token, job, task = await sync_to_async(make_job)(alice)
    raw = FIXTURE.read_bytes().decode().split("\n")[:-1]

    def store() -> None:
        TaskLogLine.objects.bulk_create(
            TaskLogLine(task=task, seq=seq, stream="stdout", text=text) for seq, text in enumerate(raw)
        )

    await sync_to_async(store)()
    socket, connected, _ = await connect(alice, job.pk)
    assert connected
    state: list[dict] = []
    await read_history(socket, state)
    (log,) = [frame for frame in state if frame["type"] == "log"]
    assert [text for _seq, _stream, text in log["lines"]] == [
        "Epoch 1/2",
        "70/70 [==============================] - 1s 2ms/step - loss: 12.6202 - mae: 3.4565",
        "Epoch 2/2",
        "70/70 [==============================] - 0s 1ms/step - loss: 4.8867 - mae: 2.0863",
    ]
    assert log["cursor"] == 3
    await socket.disconnect()
