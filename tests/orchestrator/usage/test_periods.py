"""The period a usage reader may ask for (orchestrator/usage/periods.py): defaults, bounds, and a message with its
field for each bad input."""

from __future__ import annotations

from datetime import date

import pytest

from orchestrator.usage.periods import MAX_DAYS, BadQuery, parse

TODAY = date(2026, 11, 28)


def test_it_defaults_to_the_last_30_days_by_user() -> None:
    query = parse({}, TODAY)
    assert (query.start, query.end, query.by) == (date(2026, 10, 30), TODAY, "user")
    assert len(query.days) == 30


def test_it_takes_a_period_and_a_grouping() -> None:
    query = parse({"from": "2026-09-01", "to": "2026-11-29", "by": "group"}, TODAY)
    assert (query.start, query.end, query.by, len(query.days)) == (date(2026, 9, 1), date(2026, 11, 29), "group", 90)


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"by": "team"}, "by", "`by` is one of user, group, cluster, not 'team'."),
        ({"from": "yesterday"}, "from", "`from` is a date as YYYY-MM-DD (UTC), not 'yesterday'."),
        ({"to": "2026-02-30"}, "to", "`to`: 2026-02-30 is no calendar date."),
        ({"from": "２０２６-01-01"}, "from", "`from` is a date as YYYY-MM-DD (UTC), not '２０２６-01-01'."),
        ({"from": "2026-11-02", "to": "2026-11-01"}, "from", "`from` (2026-11-02) is after `to` (2026-11-01)."),
        (
            {"from": "2025-01-01", "to": "2026-01-02"},
            "from",
            f"At most {MAX_DAYS} days at once; 2025-01-01 to 2026-01-02 is 367.",
        ),
    ],
)
def test_it_refuses_bad_input_naming_the_field(params: dict[str, str], field: str, message: str) -> None:
    with pytest.raises(BadQuery) as refused:
        parse(params, TODAY)
    assert (refused.value.field, refused.value.message) == (field, message)


def test_a_leap_year_of_days_is_allowed() -> None:
    assert len(parse({"from": "2024-01-01", "to": "2024-12-31"}, TODAY).days) == MAX_DAYS
