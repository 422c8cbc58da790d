"""The hardening of what arrives never makes what was stored unreadable, and never splits a conversation:
references stored before spans named their trace resolve as they did; ids and revisions refused on the
way in are still read back from stored documents; an OTLP conversation id the schema refuses is escaped
instead of leaving its conversation unfinished; a multi-line format with a broken line is refused whole."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.ingest.test_formats import _flatten, langsmith_run_tree
from tests.support.app import make_settings
from tests.support.cli import cli_runner
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.decode import DecodeError, validate
from vigil.ingest.otlp.compact import compact, expand
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.schema import Conversation
from vigil.store.models import ConversationRow

LONG = "v" * 300


def _span(trace: str, sid: str, start: int, value: str) -> dict[str, Any]:
    return {"trace_id": trace, "span_id": sid, "start_ns": start, "end_ns": start + 1, "attributes": {"in": value}}


def test_references_stored_before_they_named_their_trace_resolve_as_they_did() -> None:
    """Rows written before references carried ``"t"`` meant "the latest earlier span of that id": trace A's
    span 2 repeating trace B's span 1 read back as B's value, and still does; new rows say which trace."""
    a, b = "a" * 32, "b" * 32
    first, second = f"FIRST {LONG}", f"SECOND {LONG}"
    old_rows = [
        _span(a, "1", 1, first),
        _span(b, "1", 2, second),
        {**_span(a, "2", 3, ""), "attributes": {"in": {"$same": "1"}}},  # as the old compaction wrote it
    ]
    assert [s["attributes"]["in"] for s in expand(old_rows)] == [first, second, second]
    new_rows, _ = compact([_span(a, "1", 1, first), _span(b, "1", 2, second), _span(a, "2", 3, second)])
    assert new_rows[2]["attributes"]["in"] == {"$same": "1", "t": b}
    assert [s["attributes"]["in"] for s in expand(new_rows)] == [first, second, second]
    same_trace, _ = compact([_span(a, "1", 1, first), _span(a, "2", 2, first)])
    assert same_trace[1]["attributes"]["in"] == {"$same": "1", "t": ""}
    assert [s["attributes"]["in"] for s in expand(same_trace)] == [first, first]


def _doc(**fields: Any) -> dict[str, Any]:
    return {
        "conversation_id": "c-1",
        "agent_id": "a",
        "agent_version": "v1",
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }


@pytest.mark.parametrize(
    "fields", [{"revision": "3"}, {"revision": True}, {"conversation_id": "ticket\t17"}, {"conversation_id": " "}]
)
def test_what_arrives_is_refused_but_a_stored_document_saying_it_is_still_read(fields: dict[str, Any]) -> None:
    """Ingest refuses a string or boolean revision and an id with control characters or only blanks; the
    judge, export, calibration and the console validate stored documents without those rules, so documents
    stored before them stay readable."""
    with pytest.raises(DecodeError):
        validate(_doc(**fields))
    assert Conversation.model_validate_json(orjson.dumps(_doc(**fields))).agent_id == "a"


def test_an_otlp_conversation_id_with_control_characters_is_escaped_and_finished(sqlite_url: str) -> None:
    """A ``gen_ai.conversation.id`` the schema refuses (a newline in it, only blanks) becomes a conversation
    all the same, under the id escaped (or the trace's own key), finished once by the idle finisher."""
    rt = wire(
        build_runtime(make_settings(sqlite_url, otlp_trace_idle_seconds=600.0), registry=CollectorRegistry()),
        {"consume"},
    )
    ingest = rt.get(TraceIngest)
    said = orjson.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "ok"}]}]).decode()
    for n, cid in enumerate(["conv-42\n", "   "], 1):
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.conversation.id": cid, "gen_ai.output.messages": said}
        span = {
            "trace_id": f"{n:032x}",
            "span_id": f"{n:016x}",
            "parent_span_id": "00000000000000ff",
            "name": "chat m",
            "kind": 3,
            "start_ns": 10**18,
            "end_ns": 10**18 + 1,
            "attributes": attrs,
            "events": [],
            "status": {"code": 0, "message": ""},
            "resource": {},
        }
        assert ingest.ingest([span]).stored == 1
    later = datetime.now(UTC) + timedelta(seconds=601)
    assert sorted(ingest.finish_idle("f", now=later)) == ["conv-42\\x0a", f"otel-{2:032x}"]
    assert ingest.finish_idle("f", now=later) == []
    with rt.sessions() as s:
        assert s.get(ConversationRow, "conv-42\\x0a") is not None
    rt.close()


def test_a_broken_line_in_a_format_whose_conversations_span_lines_refuses_the_file(
    tmp_path: Path, sqlite_url: str
) -> None:
    """LangSmith runs (like Agents SDK spans) make one conversation of many lines: with one line not JSON,
    importing the rest would store each orphaned child run as a conversation of its own, and importing the
    mended file later would store the turns again. The file is refused whole, naming the line."""
    runs = [orjson.dumps(r) for r in _flatten(orjson.loads(orjson.dumps(langsmith_run_tree())))]
    f = tmp_path / "runs.jsonl"
    f.write_bytes(b"\n".join([runs[0][: len(runs[0]) // 2], *runs[1:]]) + b"\n")
    env = {"VIGIL_DATABASE_URL": sqlite_url, "VIGIL_METRICS_PORT": "0"}
    result = cli_runner(env=env).invoke(cli_app(), ["import", str(f)])
    assert result.exit_code == 2, result.output
    assert "line(s) 1 not JSON" in result.output and "refused whole" in result.output
    rt = build_runtime(make_settings(sqlite_url))
    with rt.sessions() as s:
        assert s.query(ConversationRow).count() == 0
    rt.close()


def cli_app() -> Any:
    from vigil.app.cli import app

    return app
