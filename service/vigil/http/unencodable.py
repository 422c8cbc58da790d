"""Answers for request bodies that Python's JSON reader accepts but nothing downstream can hold.

FastAPI parses a JSON body with the standard library, which lets two things through: a lone UTF-16
surrogate (``"\\ud800"``, not a character: no database can store it and no UTF-8 encoder can write it)
and a number past a double's range (``1e400`` becomes ``inf``, which JSON cannot write back). Both used
to end as a 500: the first when the row was written, the second when the 422 echoed the bad input.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

SURROGATE_DETAIL = (
    "a text field holds a lone UTF-16 surrogate (such as \\ud800), which is not a character "
    "and cannot be stored: nothing was saved"
)


def printable(value: Any) -> Any:
    """``value`` with every float JSON cannot write as a string and every lone surrogate escaped."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable(v) for v in value]
    return value


def validation_response(exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 (``{"detail": [field errors]}``), writable whatever input it echoes."""
    return JSONResponse({"detail": printable(jsonable_encoder(exc.errors()))}, 422)


def surrogate_response() -> JSONResponse:
    return JSONResponse({"detail": SURROGATE_DETAIL, "reason": "invalid_unicode"}, 400)
