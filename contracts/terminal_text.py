"""A log line as a terminal would show it: progress bars at their last state.

tf_keras redraws its progress bar on every update with backspaces and a carriage return and ends the line only at the
epoch's end (it takes any process on Linux for a terminal: `posix` is in `sys.modules`), so one stored line of a
task's output holds every redraw of an epoch's bar: `\\r 1/70 [...] - loss: 15.54\\x08\\x08...\\r30/70 [==>...]...`.
`render_line` plays such a line the way a terminal does and returns what would be left on the screen:

- `\\r` returns to column 0, `\\x08` moves one column back (never before column 0), and later characters overwrite
  what is under them; a line is never erased by either, so a shorter redraw leaves the end of a longer one (as on a
  screen);
- ANSI escapes: colours and other SGR (`ESC[...m`) are dropped; the cursor moves within a line (`ESC[nD`, `ESC[nC`,
  `ESC[nG`) and the line erases (`ESC[K`, `ESC[1K`, `ESC[2K`) that tqdm and rich use are applied; every other escape
  (cursor up/down, OSC titles, a bare ESC) and every other control character but a tab is dropped;
- trailing spaces are dropped (a redraw pads with spaces over a longer one; nothing a reader can see).

One character is one column (a wide CJK character counts one). The cost is linear in the line's length: the line is
cut into runs of text and runs of control characters, and each run is one slice write or one cursor move. What it
keeps is bounded by `width` (characters written past that column are dropped, as a terminal that wide would), so a
1 MB line of redraws costs a buffer of at most `width` characters.

A line without control characters is returned as it is (cut to `width`): the cost of the common line is one regular
expression search. Escapes can jump the cursor far for a few bytes and then pad or erase a whole line; a line whose
escapes would cost more than 4 cells per character of it (and of `width`) to play is shown with its control characters
and escapes removed instead, so no line costs more than linear time to render.

Stored logs keep the raw text; the read paths render it (the job page's tail, the task log page, the API's lines and
download, `tfdash logs`), the API and the download with a way to ask for the raw text.
"""

from __future__ import annotations

import re

from contracts.limits import MAX_LOG_LINE_CHARS

# Anything a terminal would not print as it is: C0 controls but the tab, DEL, and ESC (which opens an escape).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

_TOKEN = re.compile(
    r"(?P<text>[^\x00-\x08\x0a-\x1f\x7f]+)"
    r"|(?P<cr>\r+)"
    r"|(?P<bs>\x08+)"
    r"|\x1b\[(?P<params>[0-?]*)[ -/]*(?P<final>[@-~])"  # CSI: ESC [ parameters intermediates final
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC (a window title): up to BEL or ST, or the line's end
    r"|\x1b[ -/]*[0-~]?"  # any other escape, or a bare ESC at the line's end
    r"|[\x00-\x1f\x7f]"  # any other control character
)


def render_line(text: str, width: int = MAX_LOG_LINE_CHARS) -> str:
    """`text` (one line, without its newline) as a terminal `width` columns wide would leave it on the screen."""
    if _CONTROL.search(text) is None:
        return text[:width]
    cells = screen_cells(text, width)
    return _text_only(text, width) if cells is None else cells.rstrip(" ")


def screen_cells(text: str, width: int = MAX_LOG_LINE_CHARS) -> str | None:
    """What `text` leaves on the screen, every cell (trailing spaces included), or None when its escapes would cost
    more than the work budget to play."""
    screen = _Screen(width, budget=_WORK_PER_CHAR * len(text) + _WORK_PER_CHAR * width)
    try:
        for match in _TOKEN.finditer(text):
            kind = match.lastgroup
            if kind == "text":
                screen.write(match.group())
            elif kind == "cr":
                screen.cursor = 0
            elif kind == "bs":
                screen.cursor = max(0, screen.cursor - len(match.group()))
            elif kind == "final":
                screen.csi(match.group("params"), match.group("final"))
            # Anything else (an OSC, another escape or control character) leaves no mark.
    except _OverBudget:
        return None
    return "".join(screen.cells)


def fold(text: str, width: int = MAX_LOG_LINE_CHARS) -> str:
    """`text` with everything before its last carriage return replaced by the cells it leaves on the screen: what the
    agent ships of a long line of redraws. Exact: the cells hold no control character, so playing them and then the
    `\r` leaves the screen as the replaced part did (cells and cursor), and the rest plays the same; `render_line`
    of the result is `render_line(text)` (for any line whose escapes stay within the work budget). Unchanged when
    there is nothing to fold or the part is over its budget."""
    cut = text.rfind("\r")
    if cut <= 0:
        return text
    cells = screen_cells(text[:cut], width)
    return text if cells is None else cells + text[cut:]


def render_lines(texts: list[str], width: int = MAX_LOG_LINE_CHARS) -> list[str]:
    return [render_line(text, width) for text in texts]


# Cells a line may cost to render, per character of it (and per column of the width): a line's writes cost one a
# character; only escapes that jump the cursor far and then pad or erase cost more than their length.
_WORK_PER_CHAR = 4


class _OverBudget(Exception):
    pass


def _text_only(text: str, width: int) -> str:
    """The line's printable runs alone: what a line whose escapes would cost too much to play is shown as."""
    return "".join(m.group() for m in _TOKEN.finditer(text) if m.lastgroup == "text")[:width]


class _Screen:
    """One line of a terminal: its cells (at most `width`), the cursor's column (not bounded: a cursor past the
    width writes nothing) and what is left of the work `budget` (cells written, padded or erased)."""

    def __init__(self, width: int, budget: int) -> None:
        self.width = width
        self.cells: list[str] = []
        self.cursor = 0
        self.budget = budget

    def spend(self, cells: int) -> None:
        self.budget -= cells
        if self.budget < 0:
            raise _OverBudget

    def write(self, run: str) -> None:
        start = self.cursor
        self.cursor = start + len(run)
        if start >= self.width:
            return
        run = run[: self.width - start]
        if start > len(self.cells):  # the cursor was moved past the end: the gap shows blank
            self.spend(start - len(self.cells))
            self.cells.extend(" " * (start - len(self.cells)))
        self.spend(len(run))
        self.cells[start : start + len(run)] = run

    def csi(self, params: str, final: str) -> None:
        n = _number(params)
        if final == "D":  # cursor back n
            self.cursor = max(0, self.cursor - max(n, 1))
        elif final == "C":  # cursor forward n
            self.cursor += max(n, 1)
        elif final == "G":  # cursor to column n (1-based)
            self.cursor = max(n, 1) - 1
        elif final == "K":  # erase in line: 0 to its end, 1 from its start, 2 all of it; the cursor stays
            if n == 0:
                self.spend(max(0, len(self.cells) - self.cursor))
                del self.cells[self.cursor :]
            elif n == 1:
                upto = min(self.cursor + 1, len(self.cells))
                self.spend(upto)
                self.cells[:upto] = " " * upto
            elif n == 2:
                self.spend(len(self.cells))
                self.cells.clear()
        # SGR (colours) and every other sequence: nothing on the line.


def _number(params: str) -> int:
    """The first numeric parameter of a CSI sequence (0 when absent or not a plain number), bounded."""
    first = params.split(";", 1)[0]
    return min(int(first), MAX_LOG_LINE_CHARS) if first.isdigit() else 0
