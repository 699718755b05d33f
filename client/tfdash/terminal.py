"""Text from tasks made safe to print on a terminal.

A task's output is whatever its script printed: a line can hold escape sequences that a terminal obeys rather than
shows, and the person running `tfdash logs` is not the one who wrote the script (staff read every job's logs). OSC 52
writes the reader's clipboard, OSC 0/2 retitle the window, CSI sequences move the cursor and erase what was printed,
some terminals answer a query by typing into the shell, and DCS/APC strings reach terminal-specific handlers.
`printable` removes all of them, as `less -R` does not and `cat -v` does: every ESC sequence (CSI, OSC, DCS, SOS,
PM, APC, and the two-character ones), their one-byte C1 forms, every other C0 and C1 control but tab and newline,
DEL, and the Unicode bidirectional overrides and isolates, which reorder what is shown ("Trojan Source").

A carriage return: one ending a line (CRLF output) is dropped; any other becomes a line break, so what a progress bar
drew over stays readable and no text can be hidden behind later text on the same line.
"""

from __future__ import annotations

import re

# CSI: ESC [ or 0x9B, parameter bytes 0x30-0x3F, intermediate bytes 0x20-0x2F, a final byte 0x40-0x7E.
_CSI = r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
# OSC, DCS, SOS, PM, APC: a string up to BEL, ST (ESC \ or 0x9C), or the end of the text when unterminated.
_STRING = r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])(?:[^\x07\x1b\x9c]|\x1b(?!\\))*(?:\x07|\x1b\\|\x9c)?"
# Any other escape: ESC, intermediates 0x20-0x2F, a final 0x30-0x7E (ESC c resets the terminal, ESC ( 0 switches
# its character set); a lone ESC at the end.
_OTHER_ESCAPE = r"\x1b[ -/]*[0-~]?"
_SEQUENCES = re.compile(f"{_CSI}|{_STRING}|{_OTHER_ESCAPE}")
# What is left to remove: C0 controls but tab and newline, DEL, C1 controls, bidirectional overrides and isolates.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` without anything a terminal would act on (see the module's doc)."""
    if text.endswith("\r"):
        text = text[:-1]
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROLS.sub("", _SEQUENCES.sub("", text))
