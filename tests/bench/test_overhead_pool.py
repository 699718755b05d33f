"""bench/overhead.py --pool: several runs' printed rounds as one sample (no fit, no TensorFlow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.overhead import pool


def _run_output(ratios: list[float]) -> str:
    """What a run prints: TensorFlow's noise, the header, a line per round, the summary (its ratios must not count)."""
    lines = ["I0000 port.cc:153] oneDNN custom operations are on.", "keras=tf_keras examples/fit=65536 rounds=3"]
    lines += [
        f"round {i + 1:2d}: CPU s without 0.700 0.710  with 0.705 (mean)  ratio {r:.3f}   wall ratio 0.500"
        for i, r in enumerate(ratios)
    ]
    lines.append("ratio without/with, CPU time:   median 0.100 [0.100, 0.100] (95 % bootstrap interval; goal ...)")
    return "\n".join(lines) + "\n"


def test_rounds_of_several_runs_are_pooled_and_judged_against_the_goal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_text(_run_output([0.990, 0.995, 1.000]))
    second.write_text(_run_output([0.985, 0.993]))
    assert pool([first, second]) == 0
    said = capsys.readouterr().out
    assert "a.log: 3 rounds, median 0.995" in said
    assert "5 rounds of 2 runs: median 0.993" in said  # the CPU ratios only: no wall ratio, no summary line
    assert "met" in said

    second.write_text(_run_output([0.90, 0.91, 0.92]))
    assert pool([first, second]) == 1
    assert "not shown" in capsys.readouterr().out


def test_a_log_without_rounds_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "c.log"
    empty.write_text("Traceback (most recent call last):\n")
    assert pool([empty]) == 2
    assert "c.log: no round lines" in capsys.readouterr().err
