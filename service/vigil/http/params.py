"""Bounds shared by list endpoints: a number past them is a 422 with the bound, never a database error."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator
from pydantic_core import PydanticCustomError

from vigil.schema import Severity, in_utc

MAX_OFFSET = 2**31 - 1  # far past any list's length; an offset beyond the rows simply returns none
MAX_ID = 2**63 - 1  # ids and watermarks are 64-bit integers in every supported database
MAX_PAGE = 1_000_000


# a query time in UTC; one whose offset moves it past year 1 or 9999 is refused (converting it later was a 500)
Instant = Annotated[datetime, AfterValidator(in_utc)]
"""A since/until query parameter: ISO 8601, naive meaning UTC."""


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


# a severity filter in any case (``HIGH`` as ``high``), as the review queue's; an unknown one is a 422 naming the five
AnyCaseSeverity = Annotated[Severity, BeforeValidator(_lower)]
"""A severity query parameter: info, low, medium, high or critical, in any case."""


def _given(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("empty", "the parameter is empty: it needs a value")
    return value


# a required text parameter sent empty (``agent=``) is a 422 saying so; it was looked up as the empty
# name and answered a 404 ("agent '' has no finished conversations") that read as if the data were missing
Given = Annotated[str, AfterValidator(_given)]
"""A required text query parameter: not empty nor only whitespace."""
