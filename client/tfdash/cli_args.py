"""The `tfdash` command line's argument types (ids, poll periods, layer widths, experiment variants) and `Usage`, the
error for a bad command line or input."""

from __future__ import annotations

import argparse
from typing import Any


class Usage(Exception):
    """A bad command line or input: said on stderr, exit code USAGE."""


# --- argument types ---------------------------------------------------------------------------------------------
def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a positive whole number, not {text!r}")
    return int(text)


def _poll(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds, not {text!r}") from None
    if not 0.05 <= value <= 60:
        raise argparse.ArgumentTypeError("between 0.05 and 60 seconds")
    return value


def _widths(text: str) -> list[int]:
    try:
        return [int(w) for w in text.replace(",", " ").split()]
    except ValueError:
        raise Usage(f"--hidden takes layer widths, e.g. 256,256, not {text!r}") from None


def _variant(text: str) -> dict[str, Any]:
    parts = text.split(":")
    if len(parts) != 4 or not all(p.isascii() and p.isdigit() for p in parts[1:]):
        raise argparse.ArgumentTypeError(
            f"--variant takes STRATEGY:WORKERS:PS:DEVICES, e.g. mirrored:1:0:2, not {text!r}"
        )
    strategy, workers, ps, devices = parts
    return {"strategy": strategy, "workers": int(workers), "ps": int(ps), "devices_per_worker": int(devices)}
