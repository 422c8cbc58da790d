"""Lists page by cursor (keyset) without gaps or repeats, count up to a cap, and bound their offset
(GET /v1/conversations and GET /v1/review/queue, SQLite and Postgres)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.app import REVIEWER
from tests.support.review import review_client, review_runtime, simulated, store


def _walk(c: Any, path: str, params: dict[str, Any], key: str) -> list[str]:
    seen: list[str] = []
    cursor = None
    for _ in range(100):
        r = c.get(path, params={**params, **({"cursor": cursor} if cursor else {})}, headers=REVIEWER)
        assert r.status_code == 200, r.text
        body = r.json()
        seen += [it[key] for it in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            return seen
    raise AssertionError("cursor never ran out")


@pytest.fixture
def loaded(db_url):  # type: ignore[no-untyped-def]
    rt = review_runtime(db_url, list_count_cap=10, list_max_offset=20)
    with review_client(rt) as c:
        convs = simulated(45, "v1:0.6", seed=3)
        for i in range(0, 45, 15):  # three batches: rows of one batch share their received_at
            store(rt, convs[i : i + 15])
        for x in convs[:12]:  # equal priorities: ties broken by creation, then id
            c.post("/v1/review/items", json={"conversation_id": x["conversation_id"]}, headers=REVIEWER)
        yield rt, c
    rt.close()


def test_conversations_cursor_pages_cover_the_list_once(loaded) -> None:  # type: ignore[no-untyped-def]
    _rt, c = loaded
    full = c.get("/v1/conversations", params={"limit": 500}, headers=REVIEWER).json()
    assert len(full["items"]) == 45
    assert full["total"] == 10 and full["total_capped"] and full["total_text"] == "10+"
    paged = _walk(c, "/v1/conversations", {"limit": 7}, "conversation_id")
    assert paged == [it["conversation_id"] for it in full["items"]]
    filtered = _walk(c, "/v1/conversations", {"limit": 4, "agent": "support-bot", "version": "v1"}, "conversation_id")
    assert filtered == paged
    assert c.get("/v1/conversations", params={"offset": 21}, headers=REVIEWER).status_code == 422
    assert c.get("/v1/conversations", params={"offset": 20}, headers=REVIEWER).status_code == 200
    assert c.get("/v1/conversations", params={"cursor": "garbage!"}, headers=REVIEWER).status_code == 422


def test_queue_cursor_pages_cover_the_queue_once(loaded) -> None:  # type: ignore[no-untyped-def]
    _rt, c = loaded
    full = c.get("/v1/review/queue", params={"limit": 500}, headers=REVIEWER).json()
    ids = [it["conversation_id"] for it in full["items"]]
    assert len(ids) > 12 and len(set(ids)) == len(ids)
    assert full["counts"]["available"] == 10 and "available" in full["capped"]
    assert full["count_text"]["available"] == "10+" and full["total_capped"]
    assert _walk(c, "/v1/review/queue", {"limit": 5}, "conversation_id") == ids
    assert c.get("/v1/review/queue", params={"offset": 21}, headers=REVIEWER).status_code == 422
    assert c.get("/v1/review/queue", params={"cursor": "e30"}, headers=REVIEWER).status_code == 422


def test_a_version_whose_traffic_ended_lists_from_its_newest_conversation(db_url) -> None:  # type: ignore[no-untyped-def]
    """The list of one version starts at that version's newest conversation (found on its own index), not
    at the newest conversation of all: every row of the version, newest first, and none of the others."""
    from sqlalchemy import select

    from vigil.store.models import ConversationRow as C

    rt = review_runtime(db_url)
    with review_client(rt) as c:
        convs = simulated(32, "v1:0.6", seed=5)
        for x in convs[12:]:
            x["agent_version"] = "v2"
        for i in range(0, 32, 8):  # v1 in the first two batches, then v2 only
            store(rt, convs[i : i + 8])
        listed = _walk(c, "/v1/conversations", {"limit": 5, "agent": "support-bot", "version": "v1"}, "conversation_id")
        with rt.sessions() as s:
            expected = list(
                s.scalars(
                    select(C.conversation_id)
                    .where(C.agent_id == "support-bot", C.agent_version == "v1")
                    .order_by(C.received_at.desc(), C.conversation_id)
                )
            )
        assert listed == expected and len(listed) == 12
        none = c.get("/v1/conversations", params={"agent": "support-bot", "version": "v9"}, headers=REVIEWER).json()
        assert none["items"] == [] and none["total"] == 0 and none["next_cursor"] is None
    rt.close()


def test_a_rule_filter_pages_alike_whether_its_conversations_are_few_or_many(loaded) -> None:  # type: ignore[no-untyped-def]
    """A rule found in at most list_count_cap conversations is read by key from its findings (one found only
    in old conversations walked every newer one); more fall back to the index walk: the same pages."""
    from sqlalchemy import select

    from vigil.store import reads
    from vigil.store.models import FindingRow

    rt, c = loaded
    listed = c.get("/v1/conversations", params={"limit": 500}, headers=REVIEWER).json()["items"]
    full = [it["conversation_id"] for it in listed]
    with rt.sessions() as s:
        pairs = set(s.execute(select(FindingRow.rule_id, FindingRow.conversation_id)).all())
        for rule in {r for r, _ in pairs}:
            expected = [cid for cid in full if (rule, cid) in pairs]
            for cap in (10, 2):  # few (read by key) and many (the walk) for every rule here
                seen: list[str] = []
                cursor = None
                while True:
                    page = reads.list_conversations(s, 2, 0, cursor, cap, rule=rule)
                    seen += [it["conversation_id"] for it in page["items"]]
                    assert (page["total"], page["total_capped"]) == (min(len(expected), cap), len(expected) > cap)
                    if (cursor := page["next_cursor"]) is None:
                        break
                assert seen == expected, (rule, cap)


def test_a_severity_list_can_use_the_partial_index_of_severe_conversations(db_url) -> None:  # type: ignore[no-untyped-def]
    """The severities are written into the statement: a bound list would hide from the planner that only
    high and critical conversations qualify, and it walked every conversation instead."""
    from sqlalchemy import text

    from vigil.store import reads

    rt = review_runtime(db_url)
    try:
        store(rt, simulated(40, "v1:0.6", seed=3))
        with rt.sessions() as s:
            stmt = reads.list_query(min_severity="critical").with_only_columns(text("1"))
            sql = str(stmt.compile(s.get_bind(), compile_kwargs={"render_postcompile": True}))
            assert "'critical'" in sql
            if s.get_bind().dialect.name == "postgresql":
                s.execute(text("SET LOCAL enable_seqscan = off"))
                plan = "\n".join(r[0] for r in s.execute(text("EXPLAIN " + sql)))
                assert "ix_conversations_severe" in plan, plan
            else:  # SQLite refuses INDEXED BY an index the statement cannot use ("no query solution")
                forced = sql.replace("FROM conversations", "FROM conversations INDEXED BY ix_conversations_severe")
                plan = "\n".join(str(r[-1]) for r in s.execute(text("EXPLAIN QUERY PLAN " + forced)))
                assert "ix_conversations_severe" in plan, plan
    finally:
        rt.close()
