"""A long line of progress-bar redraws (a long tf_keras epoch) is folded by the agent as it grows
(supervision/output_lines.py): what it ships renders exactly as the whole line would, at its last state, where the
line cut at MAX_LINE_BYTES showed the epoch's first seconds; a restarted agent carries on from the folded part."""

from __future__ import annotations

import os
from pathlib import Path

from contracts.terminal_text import render_line
from tests.worker_agent.recording import Recorder
from worker_agent.supervision.output import MAX_LINE_BYTES, OutputFiles, TaskLogs
from worker_agent.supervision.output_lines import FOLD_BYTES

STEPS = 2000


def redraw(step: int, loss: float) -> bytes:
    """One redraw as tf_keras writes it: backspaces over the previous one, a carriage return, the bar."""
    done = step * 30 // STEPS
    bar = f"{step:4d}/{STEPS} [" + "=" * done + ">" + "." * (30 - done) + f"] - ETA: 3s - loss: {loss:7.4f}"
    return b"\x08" * 80 + b"\r" + bar.encode()


def epoch(first: int = 1, last: int = STEPS) -> bytes:
    return b"".join(redraw(step, 10 / step) for step in range(first, last + 1))


def final_bar() -> str:
    return f"{STEPS}/{STEPS} [{'=' * 30}>] - ETA: 3s - loss: {10 / STEPS:7.4f}"


def open_task(tmp_path: Path, task_id: int) -> tuple[OutputFiles, dict[str, int]]:
    files = OutputFiles(tmp_path)
    return files, files.create(task_id, 1)


def close(fds: dict[str, int]) -> None:
    for fd in fds.values():
        os.close(fd)


def test_a_long_epoch_read_as_it_grows_ships_its_last_state_in_a_few_kilobytes(tmp_path):
    raw = b"Epoch 1/1\n" + epoch() + b"\n"
    assert len(raw) > 5 * MAX_LINE_BYTES  # as it was, the line was cut at its first 40 kB
    assert render_line(raw[10 : 10 + MAX_LINE_BYTES].decode()) != final_bar()
    files, fds = open_task(tmp_path, 1)
    recorder = Recorder()
    logs = TaskLogs(1, 1, recorder, files)
    logs.open()
    try:
        for start in range(0, len(raw), 1000):  # the task prints, the tailer reads between its writes
            os.write(fds["stdout"], raw[start : start + 1000])
            logs.read_available(final=False)
    finally:
        close(fds)
    logs.read_available(final=True)
    logs.flush(last=True)

    shipped = [text for _seq, _stream, text in recorder.lines(1)]
    assert len(shipped) == 2 and render_line(shipped[0]) == "Epoch 1/1"
    assert render_line(shipped[1]) == render_line(raw[10:-1].decode()) == final_bar()
    assert len(shipped[1].encode()) < FOLD_BYTES + 1000  # ~2 redraws and what arrived since the last fold


def test_a_long_epoch_read_at_once_is_folded_too(tmp_path):
    raw = epoch() + b"\r\n" + b"next line\n"
    files, fds = open_task(tmp_path, 2)
    os.write(fds["stdout"], raw)
    close(fds)
    recorder = Recorder()

    assert TaskLogs(2, 1, recorder, files).drain() == 2

    shipped = [text for _seq, _stream, text in recorder.lines(2)]
    assert [render_line(text) for text in shipped] == [final_bar(), "next line"]
    assert len(shipped[0]) < 1000


def test_a_restarted_agent_carries_on_from_the_folded_part(tmp_path):
    files, fds = open_task(tmp_path, 3)
    recorder = Recorder()  # publishes at once: the position is persisted with each batch
    logs = TaskLogs(3, 1, recorder, files)
    logs.open()
    os.write(fds["stdout"], epoch(1, 1000))
    logs.read_available(final=False)  # folded: the unfinished line's carry is in the position
    os.write(fds["stderr"], b"a warning\n")
    logs.read_available(final=False)
    logs.flush()  # the warning's batch persists the position, the stdout carry with it, and frees the bytes behind
    saved = files.load_position(3, 1)
    assert saved.carry("stdout") and saved.offset("stdout") > len(epoch(1, 900))
    logs.close()  # the agent is gone; the task prints on
    os.write(fds["stdout"], epoch(1001, STEPS) + b"\n")
    close(fds)

    successor = Recorder()
    assert TaskLogs(3, 1, successor, files).drain() == 2

    (line,) = successor.lines(3)
    assert line[1] == "stdout" and render_line(line[2]) == final_bar()


def test_a_short_line_of_redraws_is_shipped_as_written(tmp_path):
    raw = epoch(1, 20) + b"\n"  # about 2.6 kB: a short epoch
    assert len(raw) < FOLD_BYTES
    files, fds = open_task(tmp_path, 4)
    os.write(fds["stdout"], raw)
    close(fds)
    recorder = Recorder()

    TaskLogs(4, 1, recorder, files).drain()

    assert [text for _seq, _stream, text in recorder.lines(4)] == [raw[:-1].decode()]
