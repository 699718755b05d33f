"""What a usage reader may ask for, the one rule the API, the page and the CLI (through the API) share: a period of
UTC days `from`..`to` (inclusive, ISO dates, at most MAX_DAYS), grouped `by` user, group or cluster. Bad input is
refused with its field and a message a person can act on."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, timedelta

MAX_DAYS = 366
DEFAULT_DAYS = 30
BY = ("user", "group", "cluster")
_ISO_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")  # ASCII digits only


class BadQuery(ValueError):
    """Input refused: `field` is the parameter it is about."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Query:
    start: date
    end: date  # inclusive
    by: str

    @property
    def days(self) -> list[date]:
        return [self.start + timedelta(days=n) for n in range((self.end - self.start).days + 1)]


def _date(field: str, text: str) -> date:
    if not _ISO_DATE.match(text):
        raise BadQuery(field, f"`{field}` is a date as YYYY-MM-DD (UTC), not {text[:40]!r}.")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise BadQuery(field, f"`{field}`: {text} is no calendar date.") from None


def parse(params: Mapping[str, str], today: date) -> Query:
    """The query these parameters ask for (`from`, `to`, `by`; each optional): by default the last DEFAULT_DAYS days
    to `today`, by user."""
    by = params.get("by") or "user"
    if by not in BY:
        raise BadQuery("by", f"`by` is one of {', '.join(BY)}, not {by[:40]!r}.")
    end = _date("to", params["to"]) if params.get("to") else today
    start = _date("from", params["from"]) if params.get("from") else end - timedelta(days=DEFAULT_DAYS - 1)
    if start > end:
        raise BadQuery("from", f"`from` ({start}) is after `to` ({end}).")
    if (end - start).days + 1 > MAX_DAYS:
        raise BadQuery("from", f"At most {MAX_DAYS} days at once; {start} to {end} is {(end - start).days + 1}.")
    return Query(start=start, end=end, by=by)
