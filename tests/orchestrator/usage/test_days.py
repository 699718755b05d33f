"""An interval split at UTC midnights (orchestrator/usage/days.py, plain Python)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

from orchestrator.usage.days import split_by_day


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_it_keeps_an_interval_within_one_day_whole() -> None:
    assert split_by_day(at("2026-03-01T10:00:00"), at("2026-03-01T12:30:00")) == [(date(2026, 3, 1), 9000.0)]


def test_it_splits_at_midnight_utc() -> None:
    assert split_by_day(at("2026-03-01T23:30:00"), at("2026-03-02T00:45:00")) == [
        (date(2026, 3, 1), 1800.0),
        (date(2026, 3, 2), 2700.0),
    ]


def test_it_gives_every_day_of_a_long_interval_and_the_seconds_add_up() -> None:
    start, end = at("2026-02-27T06:00:00.250000"), at("2026-03-02T03:00:00")
    parts = split_by_day(start, end)
    assert [day for day, _ in parts] == [date(2026, 2, 27), date(2026, 2, 28), date(2026, 3, 1), date(2026, 3, 2)]
    assert parts[1][1] == parts[2][1] == 86_400.0
    assert sum(seconds for _, seconds in parts) == (end - start).total_seconds()


def test_it_reads_other_zones_in_utc() -> None:
    paris = timezone(timedelta(hours=1))
    # 00:30 in Paris is 23:30 UTC the day before.
    start = datetime(2026, 3, 2, 0, 30, tzinfo=paris)
    assert split_by_day(start, start + timedelta(hours=1)) == [(date(2026, 3, 1), 1800.0), (date(2026, 3, 2), 1800.0)]


def test_an_end_not_after_the_start_is_nothing() -> None:
    assert split_by_day(at("2026-03-01T10:00:00"), at("2026-03-01T10:00:00")) == []
    assert split_by_day(at("2026-03-01T10:00:00"), at("2026-03-01T09:00:00")) == []
