"""Unusual but valid records in each format, read as sent: nothing rounded, dropped or merged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vigil.ingest.importers import read_file

BIG = 2**70 + 1  # beyond 64 bits: orjson alone reads it as the nearest double


def _args(conversation: dict[str, Any]) -> list[Any]:
    return [c["function"]["arguments"] for m in conversation["messages"] for c in m.get("tool_calls") or []]


def test_formatted_bodies_and_files_keep_integers_exact_and_skip_a_byte_order_mark(
    sqlite_url: str, tmp_path: Path
) -> None:
    from tests.support.app import ADMIN, INGEST, make_client, make_settings
    from vigil.app.runtime import build_runtime

    body = b'{"messages": [{"role": "user", "content": "Refund my order."}, {"role": "assistant", "content": '
    body += b'[{"type": "tool_use", "id": "toolu_1", "name": "refund", "input": {"order": %d}}]}]}' % BIG
    rt = build_runtime(make_settings(sqlite_url))
    with make_client(rt) as client:
        r = client.post("/v1/conversations?format=anthropic", content=body, headers=INGEST)
        assert r.status_code == 202, r.text
        [cid] = r.json()["conversation_ids"]
        stored = client.get(f"/v1/conversations/{cid}", headers=ADMIN).json()["conversation"]
        assert _args(stored) == [{"order": BIG}]
        # a byte order mark is skipped, as Vigil's own schema skips it
        r = client.post("/v1/conversations?format=auto", content=b"\xef\xbb\xbf" + body, headers=INGEST)
        assert r.status_code == 202 and r.json()["format"] == "anthropic", r.text
    rt.close()
    path = tmp_path / "calls.json"
    path.write_bytes(body)
    [conv] = read_file(path).conversations
    assert [c.args for m in conv.messages for c in m.tool_calls or []] == [{"order": BIG}]
    lines = tmp_path / "calls.jsonl"
    lines.write_bytes(body + b"\n" + body.replace(b"toolu_1", b"toolu_2") + b"\n")
    convs = read_file(lines).conversations
    assert [c.args for conv in convs for m in conv.messages for c in m.tool_calls or []] == [{"order": BIG}] * 2
