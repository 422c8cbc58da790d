"""Bounds shared by list endpoints: a number past them is a 422 with the bound, never a database error."""

from __future__ import annotations

MAX_OFFSET = 2**31 - 1  # far past any list's length; an offset beyond the rows simply returns none
MAX_ID = 2**63 - 1  # ids and watermarks are 64-bit integers in every supported database
MAX_PAGE = 1_000_000
