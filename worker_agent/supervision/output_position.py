"""How far the agent has read a task attempt's output (supervision/output.py), persisted beside its files."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Position:
    """How far a task's output has been read: the next byte of each file, the next line's number, whether a file's
    reader is inside a line it already cut at MAX_LINE_BYTES (the rest of it is skipped), and the screen cells of the
    part of an unfinished line folded so far (output_lines.py)."""

    stdout: int = 0
    stderr: int = 0
    seq: int = 0
    skipping_stdout: bool = False
    skipping_stderr: bool = False
    carry_stdout: str = ""
    carry_stderr: str = ""

    def offset(self, stream: str) -> int:
        return int(getattr(self, stream))

    def skipping(self, stream: str) -> bool:
        return bool(getattr(self, f"skipping_{stream}"))

    def carry(self, stream: str) -> str:
        return str(getattr(self, f"carry_{stream}"))
