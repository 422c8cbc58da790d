"""The orjson response of large reads says what FastAPI's own encoder would have said."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
from fastapi.encoders import jsonable_encoder

from vigil.http.fastjson import FastJSON


def test_same_json_as_fastapis_encoder() -> None:
    content = {
        "window": {"since": datetime(2026, 11, 1, 12, 30, 5, 123456, tzinfo=UTC), "until": None},
        "pass_k": {"ks": [1, 2, 4], "pass_at_k": {1: 0.5, 2: np.float64(0.75)}, "per_task": [{"task_id": "t"}]},
        "signals": [{"value": 0.1, "low": None, "n": 3, "pair": (1, 2), "same": True}],
        "verdicts": {"fail", "pass"} - {"pass"},
    }
    body = FastJSON(content).body
    assert json.loads(body) == json.loads(json.dumps(jsonable_encoder(content)))
