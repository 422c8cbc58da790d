"""A JSON body that would decode to dozens of times its size in memory (a flood of empty objects or tiny
items) is refused with 413 before it is decoded, on every JSON way in (conversations, conversations in
another format, outcomes, OTLP/JSON traces and logs), and kept as a dead letter; real batches pass.

16 MB of ``[{},{},...]`` took 448 MB to decode, so a few concurrent requests within the in-flight byte
budget could take the process down."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import INGEST, make_client, make_settings
from tests.support.services import shared_data
from vigil.app.runtime import build_runtime
from vigil.ingest.importers import load_file
from vigil.schema import EXPANSION_CHECKED_FROM, decoded_estimate, too_dense
from vigil.store.models import DeadLetterRow

JSON = {**INGEST, "content-type": "application/json"}
FLOOD = b"[" + b"{}," * 100_000 + b"{}]"  # 300 kB: 30 MB once decoded
ZEROS = b"[" + b"0," * 150_000 + b"0]"


@pytest.fixture
def client(sqlite_url: str) -> Iterator[tuple[Any, Any]]:
    rt = build_runtime(make_settings(sqlite_url, otlp_progress_interval_seconds=0), registry=CollectorRegistry())
    with make_client(rt) as c:
        yield rt, c
    rt.close()


def _letters(rt: Any) -> list[tuple[str, str, int]]:
    with rt.sessions() as s:
        return [(d.source, d.reason, d.raw_size) for d in s.scalars(select(DeadLetterRow).order_by(DeadLetterRow.id))]


@pytest.mark.parametrize(
    "path",
    ["/v1/conversations", "/v1/conversations?format=openai", "/v1/outcomes", "/v1/traces", "/v1/logs"],
)
@pytest.mark.parametrize("body", [FLOOD, ZEROS], ids=["empty-objects", "tiny-items"])
def test_a_flood_of_values_is_refused_before_decoding_and_kept(client: tuple[Any, Any], path: str, body: bytes) -> None:
    rt, c = client
    r = c.post(path, content=body, headers=JSON)
    assert r.status_code == 413, r.text
    said = r.json().get("detail") or r.json().get("message")
    assert "VIGIL_MAX_JSON_EXPANSION" in said and "times its size" in said
    assert _letters(rt) == [("otlp" if path in ("/v1/traces", "/v1/logs") else "http", "oversized", len(body))]


def test_real_batches_pass_and_the_bound_can_be_switched_off(sqlite_url: str) -> None:
    convs = []
    for path in sorted(shared_data("tau2", "trajectories").glob("*.json"))[:3]:
        convs.extend(c.model_dump(mode="json", exclude_none=True) for c in load_file(path, "tau2"))
        if len(convs) >= 40:
            break
    body = orjson.dumps(convs[:40])
    assert len(body) > EXPANSION_CHECKED_FROM
    assert decoded_estimate(body) < 2 * len(body)  # real conversations: about their own size
    assert too_dense(body, 8) is None
    assert too_dense(FLOOD, 8) is not None and too_dense(FLOOD, 0) is None
    assert too_dense(FLOOD[: EXPANSION_CHECKED_FROM - 4] + b"{}]", 8) is None  # small bodies are not checked

    rt = build_runtime(make_settings(sqlite_url, max_json_expansion=0), registry=CollectorRegistry())
    with make_client(rt) as c:
        r = c.post("/v1/conversations", content=body, headers=JSON)
        assert r.status_code == 202, r.text
        assert r.json()["stored"] == 40
        r = c.post("/v1/outcomes", content=FLOOD, headers=JSON)  # no bound: decoded, then refused by its count
        assert "VIGIL_MAX_JSON_EXPANSION" not in r.text and "1000" in r.text.replace(",", ""), r.text
    rt.close()


def test_commas_and_brackets_inside_strings_do_not_count(client: tuple[Any, Any]) -> None:
    """A tool result of CSV text (164 kB, ``"0,7,3,..."``) was refused with 413 as "so many JSON objects,
    arrays and items": its commas were counted as values though it decodes to one string."""
    rt, c = client
    csv = "\n".join(",".join(str((row * 7 + col) % 10) for col in range(20)) for row in range(4000))
    conv = {
        "conversation_id": "csv-tool-result",
        "agent_id": "data-bot",
        "agent_version": "v1",
        "messages": [
            {"role": "user", "content": "Read the table."},
            {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "read_csv", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": csv},
            {"role": "assistant", "content": 'Done: it starts "[{,"'},
        ],
    }
    body = orjson.dumps(conv)
    assert too_dense(body, 8) is None
    r = c.post("/v1/conversations", content=body, headers=JSON)
    assert r.status_code == 202 and r.json()["stored"] == 1, r.text
    assert _letters(rt) == []
    # escaped quotes neither open nor close a string; an escaped backslash before a quote does not escape it
    quoted = orjson.dumps([{"a": '\\"' + "0," * 40_000 + "\\", "b": "\\"}] * 2)
    assert too_dense(quoted, 8) is None
    values = b'["\\\\",' + b"0," * 100_000 + b"0]"  # after the string "\\", 100,000 items: still refused
    assert too_dense(values, 8) is not None
    assert too_dense(FLOOD, 8) is not None and too_dense(b'["' + FLOOD[1:-1] + b'"]', 8) is None
