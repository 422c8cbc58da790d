"""Bounds shared by list endpoints: a number past them is a 422 with the bound, never a database error."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator

MAX_OFFSET = 2**31 - 1  # far past any list's length; an offset beyond the rows simply returns none
MAX_ID = 2**63 - 1  # ids and watermarks are 64-bit integers in every supported database
MAX_PAGE = 1_000_000


def utc_instant(value: datetime) -> datetime:
    """A query time in UTC. One whose offset moves it past year 1 or 9999 (``0001-01-01T00:00+01:00``)
    is refused here: converting it later raised OverflowError, a 500."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("in UTC this time falls outside the years 1 to 9999") from None


Instant = Annotated[datetime, AfterValidator(utc_instant)]
"""A since/until query parameter: ISO 8601, naive meaning UTC."""
