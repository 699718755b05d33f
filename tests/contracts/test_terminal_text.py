"""Log lines as a terminal shows them (contracts/terminal_text.py): a tf_keras progress bar at its last state.

The fixture `fixtures/tf_keras_fit_verbose1.stdout` is the stdout bytes of a real tf_keras 2.21 fit (2 epochs of 70
steps, verbose=1) run in a subprocess whose stdout was a file, as a task's is:

    x = np.random.RandomState(0).rand(2240, 8).astype("float32"); y = x.sum(axis=1, keepdims=True)
    m = tf_keras.Sequential([Dense(16, activation="relu", input_shape=(8,)), Dense(1)])
    m.compile(optimizer="adam", loss="mse", metrics=["mae"]); m.fit(x, y, batch_size=32, epochs=2, verbose=1)
"""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

import pytest

from contracts.limits import MAX_LOG_LINE_CHARS
from contracts.terminal_text import render_line, render_lines
from tests.worker_agent.recording import Recorder
from worker_agent.supervision.output import OutputFiles, TaskLogs

FIXTURE = Path(__file__).parent / "fixtures" / "tf_keras_fit_verbose1.stdout"
EPOCH_ENDS = [
    "70/70 [==============================] - 1s 2ms/step - loss: 12.6202 - mae: 3.4565",
    "70/70 [==============================] - 0s 1ms/step - loss: 4.8867 - mae: 2.0863",
]


def _agent_lines(tmp_path: Path, raw: bytes) -> list[str]:
    """`raw` written as a task's stdout and read back by the agent: the lines it numbers and ships (and the
    server stores), cut where the task's output has newlines."""
    files = OutputFiles(tmp_path)
    fds = files.create(1, 1)
    try:
        os.write(fds["stdout"], raw)
    finally:
        for fd in fds.values():
            os.close(fd)
    recorder = Recorder()
    TaskLogs(1, 1, recorder, files).drain()
    return [text for _seq, _stream, text in recorder.lines(1)]


def test_it_shows_a_real_tf_keras_fit_with_each_bar_at_its_last_state(tmp_path):
    raw = FIXTURE.read_bytes()
    assert raw.count(b"\x08") > 300 and raw.count(b"\r") >= 6  # the fixture is the real, unrendered thing
    stored = _agent_lines(tmp_path, raw)
    assert len(stored) == 4 and "\x08" in stored[1]  # stored raw: one line per epoch's bar, every redraw in it
    assert render_lines(stored) == ["Epoch 1/2", EPOCH_ENDS[0], "Epoch 2/2", EPOCH_ENDS[1]]


def test_a_line_cut_mid_epoch_shows_its_last_redraw(tmp_path):
    raw = FIXTURE.read_bytes()
    cut = raw[: raw.index(b"\r70/70")]  # the task died before the epoch's last redraw (no newline either)
    last = _agent_lines(tmp_path, cut)[-1]
    assert render_line(last) == "67/70 [===========================>..] - ETA: 0s - loss: 12.7949 - mae: 3.4823"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text, left alone  ", "plain text, left alone  "),
        ("tab\tstays", "tab\tstays"),
        ("done\r", "done"),  # a lone \r at the end (or the \r of \r\n, which the agent strips) returns, erases nothing
        ("\r\n", ""),
        ("ab\x08\x08\x08\x08X", "Xb"),  # backspace past column 0 stops there
        ("\rabcdef\rxy", "xycdef"),  # a shorter redraw leaves the end of the longer one, as a screen does
        ("\r 1/3 [>....]\r 2/3 [==>..]\r 3/3 [=====]", " 3/3 [=====]"),  # a line that is only a bar
        ("long one  \x08\x08\x08\x08\x08\x08\x08\x08\x08\x08\rshort", "shortone"),
        ("\x1b[1m3/3\x1b[0m \x1b[32mdone\x1b[0m", "3/3 done"),  # colours dropped (Keras 3 bolds its step count)
        ("50%|#####     |\x1b[K\r100%|##########|", "100%|##########|"),  # tqdm style
        ("abcdef\x1b[3D\x1b[K!", "abc!"),  # cursor back 3, erase to the end
        ("abcdef\x1b[2KXY", "      XY"),  # erase the whole line: the cursor stays where it was
        ("abcdef\x1b[3G\x1b[1K", "   def"),
        ("a\x1b[3Cb", "a   b"),
        ("\x1b]0;title\x07text\x1b[?25l\x07\x00", "text"),  # a title, hidden cursor, bell and NUL: no mark
        ("bare escape at the end\x1b", "bare escape at the end"),
        ("wide: \u4e2d\u6587\r\u00e9", "\u00e9ide: \u4e2d\u6587"),  # one character is one column
    ],
)
def test_edge_cases(raw, shown):
    assert render_line(raw) == shown


def test_wide_lines_keep_every_column_up_to_the_width():
    bar = "[" + "=" * 500 + "]"
    assert render_line("\r" + "." * 502 + "\r" + bar) == bar
    assert render_line("x" * 20 + "\ry", width=10) == "y" + "x" * 9
    assert render_line("x" * 20 + "\x08" * 5 + "y", width=10) == "x" * 10  # the cursor past the width writes nothing
    assert render_line("x" * (MAX_LOG_LINE_CHARS + 5)) == "x" * MAX_LOG_LINE_CHARS


def _bar_line(steps: int) -> str:
    """`steps` redraws as tf_keras writes them (~130 characters each, backspaces included)."""
    redraws = []
    for i in range(1, steps + 1):
        done = i * 30 // steps
        redraws.append(
            "\x08" * 80 + f"\r{i:6d}/{steps} [" + "=" * done + ">" + "." * (30 - done) + "] - ETA: 1s - loss: 4.50"
        )
    return "".join(redraws)


def test_a_1_mb_line_is_rendered_in_linear_time_and_bounded_memory():
    line = _bar_line(7000)
    assert len(line) > 1_000_000
    tracemalloc.start()
    try:
        started = time.perf_counter()
        shown = render_line(line)
        took = time.perf_counter() - started
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert shown == f"  7000/7000 [{'=' * 30}>] - ETA: 1s - loss: 4.50"
    assert peak < 64_000  # the screen (one line of cells) and one match at a time, never a copy of the line
    assert took < 5  # ~0.15 s here; a quadratic render of 7,000 redraws would take minutes
    # Linear: eight times the line costs about eight times as long, where a quadratic render would cost 64 times
    # (best of three each, against the machine's noise; measured 6-9 times here).
    small, large = _bar_line(875), _bar_line(7000)
    assert _best_of(3, large) < 24 * _best_of(3, small)


def _best_of(runs: int, line: str) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        render_line(line)
        times.append(time.perf_counter() - started)
    return min(times)


def test_escapes_that_jump_far_and_erase_cannot_make_a_line_cost_more_than_linear():
    line = "\x1b[9999GX\x1b[2K" * 50_000  # each 13 characters would pad and erase 10,000 cells
    started = time.perf_counter()
    shown = render_line(line)
    assert time.perf_counter() - started < 5
    assert shown == "X" * MAX_LOG_LINE_CHARS  # over its budget: shown with the escapes removed
