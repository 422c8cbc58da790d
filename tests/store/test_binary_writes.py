"""The hot path's bulk writes: binary COPY stores every value as the text format did, a naive time
keeps being read in the session's zone, and ``insert_new`` inserts only new rows, in order, on both
databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import make_settings
from vigil.app.runtime import build_runtime
from vigil.review.models import ReviewAuditRow, ReviewReasonRow
from vigil.runtime import Envelope
from vigil.store.db import aware
from vigil.store.models import ConversationRow, FindingRow, OutcomeRow, ReviewItemRow
from vigil.store.writes import copy_rows, insert_new

HOSTILE = 'tab\there, newline\nthere, back\\slash, quote " and \u00e9\u4e2d\U0001f600, \\N not a null'


def _conv(cid: str, started_at: str) -> bytes:
    return orjson.dumps(
        {
            "conversation_id": cid,
            "agent_id": "a",
            "agent_version": "v1",
            "started_at": started_at,
            "ended_at": "2026-11-30T10:05:00+02:00",
            "usage": {"prompt_tokens": 7, "completion_tokens": 5, "cost_usd": 0.25, "latency_ms": 1234.5},
            "messages": [
                {"role": "user", "content": HOSTILE},
                # an email in a reply: the PII rule finds it, so the findings COPY runs too
                {"role": "assistant", "content": f"write to jane.doe@example.com ({HOSTILE})"},
            ],
            "outcomes": [{"type": "task_success", "value": 0.5, "idempotency_key": f"{cid}:k"}],
        }
    )


def _key(value: object) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def test_binary_copy_stores_every_value_as_sent(pg_url: str) -> None:
    rt = build_runtime(make_settings(pg_url), registry=CollectorRegistry())
    try:
        raw = _conv("c1", "2026-11-30T10:00:00+02:00")
        result = rt.pipeline.process_raw([Envelope(raw, "test")])
        assert [i.conversation_id for i in result.stored] == ["c1"]
        with rt.sessions() as s:
            row = s.scalars(select(ConversationRow)).one()
            assert row.started_at == datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
            assert row.ended_at == datetime(2026, 11, 30, 8, 5, tzinfo=UTC)
            assert (row.tokens, row.cost_usd, row.latency_ms, row.message_count) == (12, 0.25, 1234.5, 2)
            assert orjson.loads(row.document) == orjson.loads(raw)
            assert HOSTILE in orjson.loads(row.document)["messages"][0]["content"]
            findings = s.scalars(select(FindingRow)).all()
            assert findings and all(f.conversation_id == "c1" for f in findings)
            stored = {(f.rule_id, f.message, _key(f.evidence), _key(f.details)) for f in findings}
            made = {
                (f.rule_id, f.message, _key([e.as_dict() for e in f.evidence]), _key(f.details))
                for f in result.stored[0].findings
            }
            assert stored == made
            outcome = s.scalars(select(OutcomeRow)).one()
            assert (outcome.idempotency_key, outcome.value, outcome.source) == ("c1:k", 0.5, "inline")
    finally:
        rt.close()


def test_a_naive_time_is_read_in_the_session_zone_as_before(pg_url: str) -> None:
    """The text format sent a naive time as written and the server read it in the session's zone; it still is."""
    import psycopg

    dbname = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{dbname}\" SET timezone = 'America/New_York'")
    rt = build_runtime(make_settings(pg_url), registry=CollectorRegistry())
    try:
        rt.pipeline.process_raw([Envelope(_conv("naive", "2026-11-30T10:00:00"), "test")])
        with rt.sessions() as s:
            assert s.scalars(select(ConversationRow.started_at)).one() == datetime(2026, 11, 30, 15, 0, tzinfo=UTC)
            assert s.scalars(select(ConversationRow.ended_at)).one() == datetime(2026, 11, 30, 8, 5, tzinfo=UTC)
    finally:
        rt.close()


def test_insert_new_inserts_only_new_rows_in_order(db_url: str) -> None:
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    now = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)

    def item(cid: str, agent: str | None) -> dict[str, object]:
        return {
            "conversation_id": cid,
            "agent_id": agent,
            "agent_version": None if agent is None else "v1",
            "priority": 0.0,
            "status": "open",
            "required_reviews": 2,
            "review_count": 0,
            "sampled": cid == "b",
            "created_at": now,
            "updated_at": now,
        }

    try:
        items = ReviewItemRow.__table__
        with rt.sessions() as s:
            first = insert_new(s, items, [item("b", "x"), item("a", None)], ["conversation_id"], ["conversation_id"])
            assert first == [("b",), ("a",)]
            # a repeat and a new row in one call: only the new one comes back; every value of a column NULL
            again = insert_new(s, items, [item("a", None), item("c", None)], ["conversation_id"], ["conversation_id"])
            assert again == [("c",)]
            reasons = [
                {
                    "conversation_id": "a",
                    "kind": "outcome",
                    "key": k,
                    "weight": w,
                    "detail": HOSTILE,
                    "created_at": now + timedelta(seconds=1),
                }
                for k, w in (("refund", 2.5), ("refund", 9.0), ("churn", 1.0))
            ]
            out = ["conversation_id", "kind", "key", "weight"]
            added = insert_new(s, ReviewReasonRow.__table__, reasons, ["conversation_id", "kind", "key"], out)
            assert added == [("a", "outcome", "refund", 2.5), ("a", "outcome", "churn", 1.0)]
            detail = {"reasons": [["outcome", HOSTILE, 2.5]], "at": "é"}
            audit = [{"at": now, "actor": "vigil", "action": "enqueued", "conversation_id": "a", "detail": detail}]
            copy_rows(s, ReviewAuditRow.__table__, audit)
            s.commit()
        with rt.sessions() as s:
            got = s.execute(select(items.c.conversation_id, items.c.agent_id, items.c.sampled, items.c.created_at))
            rows = sorted((c, a, sampled, aware(t)) for c, a, sampled, t in got)
            assert rows == [("a", None, False, now), ("b", "x", True, now), ("c", None, False, now)]
            assert s.scalars(select(ReviewReasonRow.detail)).all() == [HOSTILE, HOSTILE]
            assert s.scalars(select(ReviewAuditRow.detail)).one() == detail
    finally:
        rt.close()


def test_insert_new_refuses_rows_that_leave_out_a_column_with_a_default(pg_url: str) -> None:
    rt = build_runtime(make_settings(pg_url), registry=CollectorRegistry())
    try:
        with rt.sessions() as s, pytest.raises(ValueError, match=r"review_items\.priority has a default"):
            insert_new(s, ReviewItemRow.__table__, [{"conversation_id": "a"}], ["conversation_id"], ["conversation_id"])
    finally:
        rt.close()
