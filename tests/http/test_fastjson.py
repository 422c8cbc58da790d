"""The orjson response of large reads says what FastAPI would have said through a response model."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
from fastapi.encoders import jsonable_encoder
from pydantic import TypeAdapter

from vigil.http.fastjson import FastJSON


def test_same_json_as_fastapis_encoder_with_times_as_pydantic_writes_them() -> None:
    content = {
        "window": {"since": datetime(2026, 11, 1, 12, 30, 5, 123456, tzinfo=UTC), "until": None},
        "pass_k": {"ks": [1, 2, 4], "pass_at_k": {1: 0.5, 2: np.float64(0.75)}, "per_task": [{"task_id": "t"}]},
        "signals": [{"value": 0.1, "low": None, "n": 3, "pair": (1, 2), "same": True}],
        "verdicts": {"fail", "pass"} - {"pass"},
    }
    body = FastJSON(content).body
    as_pydantic = TypeAdapter(datetime).dump_python
    expected = jsonable_encoder(content, custom_encoder={datetime: lambda t: as_pydantic(t, mode="json")})
    assert json.loads(body) == json.loads(json.dumps(expected))
    assert json.loads(body)["window"]["since"] == "2026-11-01T12:30:05.123456Z"
