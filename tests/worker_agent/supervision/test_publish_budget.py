"""What one task attempt may publish through its agent (contracts/publish_limits.py), through the real metrics pipe and
output files: a task writing the same artifact line in a loop has its burst sent and the rest dropped unread and
counted; metric lines and output past their rates are dropped, counted, and the log says "lines dropped: N" where they
went, its lines still numbered without a gap."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

from contracts.limits import MAX_ARTIFACT_BYTES
from contracts.protocol import TASK_ARTIFACT, TASK_LOGS, TASK_METRICS
from contracts.publish_limits import (
    ARTIFACT_BURST_BYTES,
    ARTIFACT_BYTES_PER_S,
    LOG_BURST_BYTES,
    LOG_BYTES_PER_S,
    METRIC_BURST_BYTES,
    METRIC_BYTES_PER_S,
)
from tests.worker_agent.recording import Recorder
from worker_agent.folders import Roots
from worker_agent.supervision.metrics_pipe import MetricsPipe
from worker_agent.supervision.output import OutputFiles, TaskLogs

DROPPED_LINE = re.compile(r"^… lines dropped: ([\d,]+) ")


def feed(pipe: MetricsPipe, data: bytes) -> float:
    """Write `data` into the pipe as a task would (the reader drains it meanwhile), then end it as the task's exit
    does; returns the seconds it took."""
    started = time.monotonic()
    pipe.start("test")
    writer = threading.Thread(target=lambda: _write_all(pipe.write_fd, data))
    writer.start()
    writer.join()
    pipe.child_started()  # our write end closed: EOF
    pipe.finish(60)
    return time.monotonic() - started


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def reports(recorder: Recorder, name: str) -> list[dict]:
    return [body for sent, body in recorder.messages if sent == name]


def test_a_task_writing_one_artifact_line_in_a_loop_sends_its_burst_and_says_what_it_dropped(tmp_path: Path):
    model = tmp_path / "model.bin"
    with open(model, "wb") as out:
        out.truncate(MAX_ARTIFACT_BYTES)  # the largest artifact there may be (its entry ~85 MiB), sparse on disk
    recorder = Recorder()
    pipe = MetricsPipe(task_id=7, attempt=1, send=recorder, artifacts_from=Roots.agent(tmp_path))
    line = json.dumps({"kind": "artifact", "ts": 1.0, "name": "model.bin", "path": str(model)}).encode() + b"\n"

    took = feed(pipe, line * 1000)

    sent = reports(recorder, TASK_ARTIFACT)
    allowed = (ARTIFACT_BURST_BYTES + ARTIFACT_BYTES_PER_S * took) // MAX_ARTIFACT_BYTES
    assert 1 <= len(sent) <= allowed, (len(sent), took)
    dropped = reports(recorder, TASK_METRICS)[-1]["dropped"]  # the running totals, in the latest report
    assert dropped == {"artifacts": 1000 - len(sent), "artifact_bytes": (1000 - len(sent)) * MAX_ARTIFACT_BYTES}
    # Dropped before being read: reading and encoding 1,000 of them would take minutes and ~85 GB through the outbox.
    assert took < 60


def test_metric_lines_past_their_rate_are_dropped_and_counted(tmp_path: Path):
    recorder = Recorder()
    pipe = MetricsPipe(task_id=8, attempt=1, send=recorder)
    pad = "x" * 1000
    lines = [json.dumps({"kind": "metric", "ts": 1.0, "step": i, "metrics": {"loss": 0.5}, "pad": pad}) for i in
             range(3 * METRIC_BURST_BYTES // 1000)]  # fmt: skip

    took = feed(pipe, b"".join(line.encode() + b"\n" for line in lines))

    batches = reports(recorder, TASK_METRICS)
    events = [event for batch in batches for event in batch["events"]]
    dropped = batches[-1]["dropped"]["metric_lines"]
    assert len(events) + dropped == len(lines)
    line_bytes = len(lines[0]) + 1
    assert len(events) <= (METRIC_BURST_BYTES + METRIC_BYTES_PER_S * took) / line_bytes + 1
    assert [event["step"] for event in events] == sorted(event["step"] for event in events)  # what goes, in order


def test_output_past_its_rate_is_dropped_and_the_log_says_how_many_lines_where(tmp_path: Path):
    files = OutputFiles(tmp_path)
    recorder = Recorder()
    fds = files.create(12, 1)
    line = b"y" * 1023 + b"\n"
    count = 3 * LOG_BURST_BYTES // len(line)
    started = time.monotonic()
    os.write(fds["stdout"], line * count)  # a task printing as fast as it can
    for fd in fds.values():
        os.close(fd)
    logs = TaskLogs(12, 1, recorder, files)

    printed = logs.drain()
    took = time.monotonic() - started

    batches = reports(recorder, TASK_LOGS)
    lines = [tuple(item) for batch in batches for item in batch["lines"]]
    assert [seq for seq, _stream, _text in lines] == list(range(printed))  # numbered without a gap
    notes = [int(found.group(1).replace(",", "")) for _seq, _s, text in lines if (found := DROPPED_LINE.match(text))]
    kept = [text for _seq, _s, text in lines if not DROPPED_LINE.match(text)]
    assert notes, "no 'lines dropped' line in the log"
    assert len(kept) + sum(notes) == count  # every line either stored or counted where it went missing
    assert batches[-1]["dropped"] == sum(notes)
    assert len(kept) * len(line) <= LOG_BURST_BYTES + LOG_BYTES_PER_S * took + len(line)
    assert DROPPED_LINE.match(lines[-1][2])  # the task ended while over: the last line says so
