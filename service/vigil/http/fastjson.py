"""A JSON response serialised by orjson in one pass: large read answers (a compare with thousands of tasks)
skip FastAPI's ``jsonable_encoder``, which walks every value in Python first (seconds for a few MB)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson
from fastapi.responses import JSONResponse

# UTC times end in "Z", as pydantic writes them in every answer with a response model: one form across the API
OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_UTC_Z


def _default(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


class FastJSON(JSONResponse):
    """Return an instance (not a dict) from the endpoint, so FastAPI does not encode the content first."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=OPTIONS, default=_default)
