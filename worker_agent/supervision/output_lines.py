"""What the agent ships of one line of a task's output: its text, and a long line of redraws folded first.

tf_keras redraws its progress bar up to 20 times a second (about 200 bytes each, backspaces and a carriage return
included) and ends the line only at the epoch's end, so one epoch's line grows by some 4 kB a second: a minute-long
epoch is a 240 kB line. Cut at MAX_LINE_BYTES (40 kB) it would keep the bar of the epoch's first seconds and lose the
rest, its last state (the epoch's loss) included.

So a line of redraws is folded as it grows (contracts/terminal_text.py `fold`): once the unfinished part of a line is
FOLD_BYTES long, everything before its last `\\r` is replaced by the screen cells it leaves (the carry, kept in the
reader's position, so a restarted agent carries on from it), and the bytes behind are let go as for any line read.
A line that ends is shipped as carry + the rest, folded again at its last `\\r`: the rendered line (every read path
renders) is exactly what the whole line would render to, and what is stored is about two redraws long instead of all
of them. A line shorter than FOLD_BYTES, redraws or not (a short epoch's bar), is shipped as the task wrote it, so
`?raw=1` gives its bytes; a folded line's raw text is its carry and its last redraw.
"""

from __future__ import annotations

from contracts.limits import MAX_LOG_LINE_CHARS
from contracts.terminal_text import fold, screen_cells

# An unfinished line this long with a carriage return in it is folded (well under MAX_LINE_BYTES, 40 kB; ~20 redraws
# of a tf_keras bar, so a short epoch's line is kept as written).
FOLD_BYTES = 4096


def fold_at(data: bytes, start: int, end: int) -> int:
    """Where the line `data[start:end]` (`end`: its newline, or the end of what was read) may be folded: its last
    `\\r` (a folded line's carry stands for what is before it), or -1 when it has none past its first byte or is
    shorter than FOLD_BYTES."""
    if end - start < FOLD_BYTES:
        return -1
    cut = data.rfind(b"\r", start, end)
    return cut if cut > start else -1


def carry_after(carry: str, raw: bytes) -> str | None:
    """The screen cells that `carry` then `raw` (a part of a line up to a `\\r`) leave: the next carry, or None when
    they cannot be played within the budget (the line is then read as any other)."""
    return screen_cells(carry + raw.decode("utf-8", errors="replace"))


def line_text(carry: str, raw: bytes) -> str:
    """The text shipped for a line read as `raw` (its newline and a `\\r` before it dropped) after `carry`: folded when
    it carries something or is FOLD_BYTES long, cut to MAX_LOG_LINE_CHARS."""
    text = carry + raw.decode("utf-8", errors="replace")
    if text.endswith("\n"):
        text = text[:-1]
    if text.endswith("\r"):
        text = text[:-1]
    if carry or len(raw) >= FOLD_BYTES:
        text = fold(text)
    return text[:MAX_LOG_LINE_CHARS]
