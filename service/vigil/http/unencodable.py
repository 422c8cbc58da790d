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


ECHO_CHARS = 200  # of a string the 422 echoes
ECHO_ITEMS = 20  # of a list or object it echoes
ECHO_DEPTH = 4  # levels of nesting it echoes


def echoed(value: Any, depth: int = 0) -> Any:
    """What a 422 echoes of an input: writable as JSON (every float JSON cannot write as a string, every
    lone surrogate escaped) and bounded, however large or deep the input (a 5 MB field was echoed whole,
    twice; a field nested 900 deep overflowed the stack): strings cut at :data:`ECHO_CHARS`, lists and
    objects at :data:`ECHO_ITEMS` items and :data:`ECHO_DEPTH` levels, each cut saying what it left out."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        text = value[:ECHO_CHARS].encode("utf-8", "backslashreplace").decode("utf-8")
        return text if len(value) <= ECHO_CHARS else f"{text}… ({len(value)} characters)"
    if isinstance(value, bytes | bytearray):
        text = bytes(value[:ECHO_CHARS]).decode("utf-8", "backslashreplace")
        return text if len(value) <= ECHO_CHARS else f"{text}… ({len(value)} bytes)"
    if isinstance(value, dict):
        if depth >= ECHO_DEPTH:
            return f"{{… {len(value)} keys}}"
        out = {echoed(str(k)): echoed(v, depth + 1) for k, v in list(value.items())[:ECHO_ITEMS]}
        if len(value) > ECHO_ITEMS:
            out["…"] = f"{len(value) - ECHO_ITEMS} more keys"
        return out
    if isinstance(value, list | tuple):
        if depth >= ECHO_DEPTH:
            return f"[… {len(value)} items]"
        items = [echoed(v, depth + 1) for v in value[:ECHO_ITEMS]]
        if len(value) > ECHO_ITEMS:
            items.append(f"… {len(value) - ECHO_ITEMS} more items")
        return items
    if value is None or isinstance(value, bool | int | float):
        return value
    return echoed(str(value), depth)


def validation_response(exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 (``{"detail": [field errors]}``), each error's input and location echoed bounded and
    writable (see :func:`echoed`)."""
    errors = [{k: echoed(v) if k in ("input", "loc", "ctx") else v for k, v in e.items()} for e in exc.errors()]
    return JSONResponse({"detail": jsonable_encoder(errors)}, 422)


def surrogate_response() -> JSONResponse:
    return JSONResponse({"detail": SURROGATE_DETAIL, "reason": "invalid_unicode"}, 400)
