"""An interval split at UTC midnights (plain Python, no Django): a task that ran across midnight has seconds in each
day it touched."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta


def split_by_day(start: datetime, end: datetime) -> list[tuple[date, float]]:
    """(UTC day, seconds of [start, end) within it), in day order; nothing when end is not after start. Both must be
    aware datetimes (any zone: they are read in UTC)."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    parts: list[tuple[date, float]] = []
    while start < end:
        midnight = datetime.combine(start.date() + timedelta(days=1), datetime.min.time(), UTC)
        upto = min(end, midnight)
        parts.append((start.date(), (upto - start).total_seconds()))
        start = upto
    return parts


def day_start(day: date) -> datetime:
    """The UTC midnight that opens `day`."""
    return datetime.combine(day, datetime.min.time(), UTC)
