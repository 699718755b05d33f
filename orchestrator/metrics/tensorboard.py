"""A job's stored metric points as a TensorBoard logdir, streamed as a .tar.gz (`GET /api/jobs/<id>/tensorboard/`).

Layout: `job<id>/<task>/<phase>/events.out.tfevents.<time>.tfdash.<job>.<task>`, one run per task and phase, one tag
per metric name: `worker-0/train` holds `loss`, `accuracy`, ...; `worker-0/epoch_end` holds the epoch-end values. A
later attempt or an in-place restart of a task is a run of its own (`worker-0.attempt2`, `worker-0.restart1`), so a
restarted job's curves do not overwrite each other. Every part of a member's path comes from a safe alphabet
(`archive_part`): a phase is free text an agent reports, and a `../../x`, an absolute path or a control character must
not become a path where the archive is unpacked. Each point is one scalar event with the point's step and wall
time, written by TensorBoard's own record writer (TFRecord framing, masked CRC32C) as a scalars-plugin summary over a
float64 tensor, so the values read back are exactly the stored ones (a `simple_value` would be float32).

Nothing holds a job's points in memory: a run's event file is written to a temporary file a page of points at a time
(keyset on the (task, phase, name, step) unique index: short queries, no open transaction), then sent as one tar
member and deleted; the whole archive is compressed as it goes out.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import tarfile
import tempfile
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import IO, Any

from asgiref.sync import sync_to_async
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.record_writer import RecordWriter

from contracts.names import PATH_PART_CHARS
from orchestrator.models import MetricPoint, Task

PAGE_POINTS = 10_000
CHUNK_BYTES = 256 * 1024
_SCALAR = scalar_metadata.create_summary_metadata(display_name="", description="")
_SCALAR_SHAPE = tensor_shape_pb2.TensorShapeProto()
# What a path part in the archive may hold: contracts/names.py's PATH_PART_CHARS, as an artifact's name.
_UNSAFE = re.compile(rf"[^{PATH_PART_CHARS}]+")
MAX_PART_CHARS = 64


def archive_part(text: str) -> str:
    """`text` as one path part of the archive: itself when it is made of the safe alphabet alone (not empty, not
    starting with '.', so never `.` or `..`); otherwise its safe characters with a digest of the whole, so two
    phases that differ only in unsafe characters stay two runs."""
    cleaned = _UNSAFE.sub("_", text).lstrip(".")[:MAX_PART_CHARS]
    if cleaned == text and cleaned:
        return cleaned
    return f"{cleaned or 'x'}-{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


@dataclass(frozen=True)
class Run:
    """One TensorBoard run: a task's points of one phase."""

    path: str  # inside the archive, e.g. "job7/worker-0/train"
    task_id: int
    phase: str
    names: tuple[str, ...]


def task_run_name(task_type: str, index: int, attempt: int, restart: int) -> str:
    """`worker-0` for a task's first run; a later attempt or in-place restart says which it was."""
    name = f"{task_type}-{index}"
    if attempt > 1:
        name += f".attempt{attempt}"
    if restart:
        name += f".restart{restart}"
    return name


def runs(job_id: int) -> list[Run]:
    """The job's runs, in task order then phase."""
    series: dict[tuple[int, str], list[str]] = {}
    rows = MetricPoint.objects.filter(job_id=job_id).order_by().values_list("task_id", "phase", "name").distinct()
    for task_id, phase, name in rows:
        series.setdefault((task_id, phase), []).append(name)
    tasks = {
        row[0]: task_run_name(*row[1:])
        for row in Task.objects.filter(pk__in={task for task, _ in series}).values_list(
            "pk", "type", "index", "attempt", "restart"
        )
    }
    found = [
        Run(f"job{job_id}/{archive_part(tasks[task_id])}/{archive_part(phase)}", task_id, phase, tuple(sorted(names)))
        for (task_id, phase), names in series.items()
        if task_id in tasks
    ]
    return sorted(found, key=lambda run: run.path)


def series_page(task_id: int, phase: str, name: str, after: int | None, size: int = PAGE_POINTS) -> list[Any]:
    """The series' next `size` points above step `after`, as (step, value, ts) in step order."""
    points = MetricPoint.objects.filter(task_id=task_id, phase=phase, name=name)
    if after is not None:
        points = points.filter(step__gt=after)
    return list(points.order_by("step").values_list("step", "value", "ts")[:size])


def scalar_event(tag: str, step: int, value: float, wall_time: float, *, first: bool) -> bytes:
    """One scalar as a serialized Event; the first of its tag in a file carries the scalars plugin's metadata."""
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, tensor_shape=_SCALAR_SHAPE, double_val=[value])
    summary_value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
    if first:
        summary_value.metadata.CopyFrom(_SCALAR)
    event = event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=[summary_value]))
    return event.SerializeToString()


def write_run(run: Run, out: IO[bytes]) -> None:
    """The run's event file into `out`: the file-version record, then every series in step order."""
    writer = RecordWriter(out)
    writer.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
    for name in run.names:
        after: int | None = None
        first = True
        while True:
            page = series_page(run.task_id, run.phase, name, after)
            for step, value, ts in page:
                writer.write(scalar_event(name, step, value, ts, first=first))
                first = False
            if len(page) < PAGE_POINTS:
                break
            after = page[-1][0]
    out.flush()


def event_file_name(job_id: int, task_id: int) -> str:
    # TensorBoard finds event files by "tfevents" in the name.
    return f"events.out.tfevents.{int(time.time())}.tfdash.{job_id}.{task_id}"


def _member(path: str, size: int) -> bytes:
    info = tarfile.TarInfo(path)
    info.size, info.mtime, info.mode = size, int(time.time()), 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _padding(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)


def _file_chunks(spool: IO[bytes]) -> Iterator[bytes]:
    spool.seek(0)
    while chunk := spool.read(CHUNK_BYTES):
        yield chunk


async def archive(job_id: int) -> AsyncIterator[bytes]:
    """The job's logdir as a gzip-compressed tar, produced run by run (see the module's doc).

    Async: under ASGI Django reads a synchronous body whole before sending it; the database work of each run is done
    in the request's own thread."""
    gzip = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip stream
    written = 0
    for run in await sync_to_async(runs)(job_id):
        with tempfile.TemporaryFile(prefix="tfdash-tb-") as spool:
            await sync_to_async(write_run)(run, spool)
            size = spool.tell()
            path = f"{run.path}/{event_file_name(job_id, run.task_id)}"
            for piece in itertools.chain([_member(path, size)], _file_chunks(spool), [_padding(size)]):
                written += len(piece)
                if out := gzip.compress(piece):
                    yield out
    # The end: two zero blocks, then zeros to a whole record, as tarfile writes it.
    end = b"\0" * (2 * tarfile.BLOCKSIZE)
    written += len(end)
    end += b"\0" * (-written % tarfile.RECORDSIZE)
    yield gzip.compress(end) + gzip.flush()
