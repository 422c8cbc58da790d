"""Spans as a careless or hostile exporter sends them: the same span id twice, span ids reused by the traces
of one conversation, a span resent with other content, log records with invalid ids, a conversation that
cannot be assembled, and traces larger than what a process keeps in memory. What is stored reads back as
sent, and no conversation holds up another."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import make_settings
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.otlp import ingest as ingest_module
from vigil.ingest.otlp.ingest import RECENT_BYTES, TraceIngest
from vigil.ingest.otlp.models import OtelConversationRow, OtelEventRow
from vigil.runtime import Runtime
from vigil.store.models import ConversationRow

T0 = 1_700_000_000_000_000_000


def replica(url: str, **overrides: Any) -> Runtime:
    s = make_settings(url, **{"judge_mode": "offline", "otlp_trace_idle_seconds": 30.0, **overrides})
    return wire(build_runtime(s, registry=CollectorRegistry()), {"consume"})


def said(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


def span(trace: str, sid: int, parent: int | None, start: int, **attrs: Any) -> dict[str, Any]:
    return {
        "trace_id": trace,
        "span_id": f"{sid:016x}",
        "parent_span_id": f"{parent:016x}" if parent else None,
        "name": "chat m" if attrs else "root",
        "kind": 3,
        "start_ns": T0 + start,
        "end_ns": T0 + start + 10,
        "attributes": attrs,
        "events": [],
        "status": {"code": 0, "message": ""},
        "resource": {"service.name": "hostile-agent"},
    }


def chat(trace: str, sid: int, parent: int | None, start: int, inputs: list[Any], output: Any, **attrs: Any) -> Any:
    return span(
        trace,
        sid,
        parent,
        start,
        **{
            "gen_ai.operation.name": "chat",
            "gen_ai.input.messages": orjson.dumps(inputs).decode(),
            "gen_ai.output.messages": orjson.dumps([output]).decode(),
            **attrs,
        },
    )


def read_back(url: str, key: str) -> list[tuple[str, str, list[str]]]:
    """(trace, span, texts of its input messages) of each stored span, read by a replica that holds nothing."""
    rt = replica(url)
    try:
        spans, _ = rt.get(TraceIngest)._load(key)
    finally:
        rt.close()
    out = []
    for s in spans:
        raw = s["attributes"].get("gen_ai.input.messages")
        texts = [p["content"] for m in orjson.loads(raw) for p in m["parts"]] if raw else []
        out.append((s["trace_id"], s["span_id"], texts))
    return out


def document(rt: Runtime, cid: str) -> dict[str, Any] | None:
    with rt.sessions() as s:
        row = s.get(ConversationRow, cid)
        return orjson.loads(row.document) if row else None


LONG = "x" * 300  # long enough to be stored as a reference (see compact.MIN_CHARS)


def test_the_same_span_twice_in_a_request_stores_the_first_and_what_follows_reads_back_as_sent(db_url: str) -> None:
    """Span 1 twice (ALPHA, then BETA), then span 2 repeating BETA: span 2 must not refer to the copy of
    span 1 that is not stored (it would read back as ALPHA)."""
    rt = replica(db_url)
    trace = "a1" * 16
    alpha, beta = [said("user", f"ALPHA {LONG}")], [said("user", f"BETA {LONG}")]
    out = said("assistant", "ok")
    res = rt.get(TraceIngest).ingest(
        [
            span(trace, 9, None, 0),
            chat(trace, 1, 9, 1, alpha, out),
            chat(trace, 1, 9, 2, beta, out),
            chat(trace, 2, 9, 3, beta, out),
        ]
    )
    assert res.stored == 3 and res.refused == 0
    assert [texts for _, _, texts in read_back(db_url, f"otel-{trace}")] == [[], [f"ALPHA {LONG}"], [f"BETA {LONG}"]]
    doc = document(rt, f"otel-{trace}")
    assert doc is not None
    assert [m["content"] for m in doc["messages"] if m["role"] == "user"] == [f"ALPHA {LONG}", f"BETA {LONG}"]
    rt.close()


def test_a_span_resent_with_other_content_leaves_the_spans_referring_to_it_whole(db_url: str) -> None:
    """Request 1 stores span 1 (ALPHA); request 2 resends span 1 with BETA (not stored: the first is kept)
    and span 2 repeating BETA, which therefore cannot refer to span 1."""
    rt = replica(db_url)
    ingest = rt.get(TraceIngest)
    trace = "b2" * 16
    alpha, beta = [said("user", f"ALPHA {LONG}")], [said("user", f"BETA {LONG}")]
    out = said("assistant", "ok")
    ingest.ingest([chat(trace, 1, 9, 1, alpha, out)])
    res = ingest.ingest([chat(trace, 1, 9, 2, beta, out), chat(trace, 2, 9, 3, beta, out)])
    assert res.stored == 1
    assert [texts for _, _, texts in read_back(db_url, f"otel-{trace}")] == [[f"ALPHA {LONG}"], [f"BETA {LONG}"]]
    rt.close()


def test_traces_of_one_conversation_reusing_span_ids_read_back_as_sent(db_url: str) -> None:
    """Two traces of one conversation both number their spans from 1: a value of trace 2's span 2 extending
    trace 1's span 1 must be read back from trace 1's span 1, not from trace 2's."""
    rt = replica(db_url)
    ingest = rt.get(TraceIngest)
    t1, t2, cid = "c3" * 16, "d4" * 16, "conv-reusing-span-ids"
    u1, a1, u2 = said("user", f"first {LONG}"), said("assistant", "first answer"), said("user", "SECOND QUESTION")
    named = {"gen_ai.conversation.id": cid}
    ingest.ingest(
        [
            span(t1, 9, None, 0, **named),
            chat(t1, 1, 9, 1, [u1], a1, **named),
            span(t2, 1, None, 2, **named),
            chat(t2, 2, 1, 3, [u1, a1, u2], said("assistant", "second answer"), **named),
        ]
    )
    back = read_back(db_url, cid)
    assert (t2, f"{2:016x}", [f"first {LONG}", "first answer", "SECOND QUESTION"]) in back
    # a late span: the next revision is assembled from the stored rows
    late = span(t2, 3, 1, 50, **{**named, "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"})
    ingest.ingest([late])
    doc = document(rt, cid)
    assert doc is not None and "SECOND QUESTION" in [m["content"] for m in doc["messages"]]
    rt.close()


def test_log_records_with_invalid_ids_are_refused_and_valid_ones_stored(db_url: str) -> None:
    """Ids a span would be refused for (not hex, wrong length, an all-zero span id) refuse a log record
    too, instead of being stored under a key no span can have (or failing the insert on Postgres)."""
    rt = replica(db_url)
    ingest = rt.get(TraceIngest)
    good = "e5" * 16
    ingest.ingest([chat(good, 1, None, 1, [said("user", "hi")], said("assistant", "ok"))])

    def record(trace: str, span_id: str | None) -> dict[str, Any]:
        body = {"content": "hello"}
        return {"trace_id": trace, "span_id": span_id, "time_ns": T0 + 5, "name": "gen_ai.user.message", "body": body}

    records = [
        record("!" * 32, f"{1:016x}"),
        record(good, "z" * 16),
        record(good, "1" * 10_000),
        record(good, "0" * 16),
        record(good, f"{1:016x}"),
    ]
    for r in records:
        r["attributes"] = {"gen_ai.system": "openai"}
    res = ingest.ingest_logs(records)
    assert (res.rejected, res.stored) == (4, 1)
    assert "invalid trace or span id" in res.message()
    with rt.sessions() as s:
        assert s.scalars(select(OtelEventRow.trace_id)).all() == [good]
    rt.close()


def test_a_conversation_that_cannot_be_assembled_holds_up_no_other(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Assembling one conversation fails (a defect in a convention reader, say): the others of the same
    request and of the same idle-finisher batch are processed all the same; the failing one is reported,
    counted, and finished once by the idle finisher instead of being claimed again and again."""
    rt = replica(db_url, otlp_trace_idle_seconds=600.0)
    ingest = rt.get(TraceIngest)
    real = ingest_module.assemble

    def flaky(key: str, *args: Any, **kwargs: Any) -> Any:
        if key == "poisoned":
            raise ValueError("a convention reader's defect")
        return real(key, *args, **kwargs)

    monkeypatch.setattr(ingest_module, "assemble", flaky)
    cids = ["poisoned", "healthy-1", "healthy-2"]
    finished = [  # roots: processed now
        chat(
            f"{i + 1:032x}", 1, None, 1, [said("user", "hi")], said("assistant", "ok"), **{"gen_ai.conversation.id": c}
        )
        for i, c in enumerate(cids)
    ]
    res = ingest.ingest(finished)
    assert res.stored == 3 and "conversation poisoned: could not be assembled (ValueError)" in res.message()
    assert document(rt, "healthy-1") is not None and document(rt, "healthy-2") is not None
    assert document(rt, "poisoned") is None
    growing = [  # no roots: left to the idle finisher
        chat(f"{i + 11:032x}", 2, 9, 1, [said("user", "hi")], said("assistant", "ok"), **{"gen_ai.conversation.id": c})
        for i, c in enumerate(["poisoned-too", "idle-1", "idle-2"])
    ]
    monkeypatch.setattr(
        ingest_module, "assemble", lambda key, *a, **k: flaky("poisoned" if key == "poisoned-too" else key, *a, **k)
    )
    ingest.ingest(growing)
    from datetime import UTC, datetime, timedelta

    later = datetime.now(UTC) + timedelta(seconds=601)
    done = ingest.finish_idle("finisher", now=later)
    assert sorted(done) == ["idle-1", "idle-2"]
    assert ingest.finish_idle("finisher", now=later) == []  # the failing one is not claimed again
    with rt.sessions() as s:
        row = s.get(OtelConversationRow, "poisoned-too")
        assert row is not None and row.finished_at is not None
    rt.close()


def test_what_a_process_keeps_of_growing_traces_is_bounded_by_bytes_and_dropped_once_finished(sqlite_url: str) -> None:
    """Spans of unfinished traces are kept in memory (so the next request does not read them back), up to
    ``RECENT_BYTES`` of their strings, and no longer than their conversation is unfinished."""
    rt = replica(sqlite_url, otlp_trace_idle_seconds=600.0)
    ingest = rt.get(TraceIngest)
    big = "y" * (RECENT_BYTES // 16)
    for n in range(24):  # 24 sixteenths of the bound, in conversations that never end
        ingest.ingest([span(f"{n + 1:032x}", 2, 9, 1, **{"gen_ai.operation.name": "chat", "payload": big})])
        assert ingest._recent_bytes <= RECENT_BYTES
    assert 0 < len(ingest._recent) < 24
    ingest.ingest([span(f"{99:032x}", 2, 9, 1, **{"gen_ai.operation.name": "chat", "payload": "z" * RECENT_BYTES})])
    assert f"otel-{99:032x}" not in ingest._recent  # larger than a quarter of the bound: not kept at all
    from datetime import UTC, datetime, timedelta

    ingest.finish_idle("finisher", now=datetime.now(UTC) + timedelta(seconds=601))
    assert not ingest._recent and ingest._recent_bytes == 0 and ingest._recent_spans == 0
    rt.close()
