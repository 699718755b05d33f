"""Numbers read off the wire, checked: what a parser of an untrusted payload (host_reports.py, task_messages.py) takes
as a count, an exit code or a number within bounds, and raises ValueError for otherwise."""

from __future__ import annotations

from typing import Any


def bounded(value: Any, low: int, high: int) -> int:
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"{number} is outside {low}..{high}")
    return number


def exit_code(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not -255 <= value <= 255:
        raise ValueError(f"{value!r} is not an exit code")
    return value


def count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value
