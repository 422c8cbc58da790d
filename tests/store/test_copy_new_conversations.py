"""A batch of new conversations is COPYed straight into the table; a row another writer stores between
the check and the COPY sends the batch through the upsert, which keeps the newest revision."""

from __future__ import annotations

import orjson
from prometheus_client import CollectorRegistry
from sqlalchemy import select, text

from tests.support.app import make_settings
from vigil.app.runtime import build_runtime
from vigil.runtime import Envelope
from vigil.store import writes
from vigil.store.models import ConversationRow


def _env(cid: str, revision: int) -> Envelope:
    conv = {
        "conversation_id": cid,
        "revision": revision,
        "agent_id": "a",
        "agent_version": "v1",
        "messages": [{"role": "user", "content": f"hello {revision}"}],
    }
    return Envelope(orjson.dumps(conv), "test")


def test_new_rows_are_copied_and_a_racing_writer_falls_back_to_the_upsert(pg_url, monkeypatch) -> None:
    rt = build_runtime(make_settings(pg_url), registry=CollectorRegistry())
    try:
        first = rt.pipeline.process_raw([_env("a", 1), _env("b", 1)])
        assert [i.replaced for i in first.stored] == [False, False]

        copy = writes._pg_copy
        raced: list[str] = []

        def racing_copy(session, table, rows, into=None):  # type: ignore[no-untyped-def]
            if into is None and table.name == "conversations" and not raced:
                raced.append("c")  # another writer stores c (revision 1) after the check, before the COPY
                with rt.engine.begin() as other:
                    row = {**rows[0], "conversation_id": "c", "revision": 1, "document": '{"x": 1}'}
                    other.execute(ConversationRow.__table__.insert(), [row])
            return copy(session, table, rows, into)

        monkeypatch.setattr(writes, "_pg_copy", racing_copy)
        second = rt.pipeline.process_raw([_env("c", 2), _env("d", 1)])
        assert raced == ["c"]
        assert {i.conversation.conversation_id: i.replaced for i in second.stored} == {"c": True, "d": False}
        with rt.sessions() as s:
            revisions = dict(s.execute(select(ConversationRow.conversation_id, ConversationRow.revision)).all())
            assert revisions == {"a": 1, "b": 1, "c": 2, "d": 1}
            assert (
                "hello 2" in s.execute(text("SELECT document FROM conversations WHERE conversation_id = 'c'")).scalar()
            )
        again = rt.pipeline.process_raw([_env("a", 1), _env("e", 1)])  # a is stored: the upsert skips it
        assert [i.conversation.conversation_id for i in again.stored] == ["e"] and again.duplicates == 1
    finally:
        rt.close()


def _with_outcomes(cid: str, revision: int, keys: list[str]) -> Envelope:
    conv = orjson.loads(_env(cid, revision).raw)
    conv["outcomes"] = [{"type": "task_success", "value": 1.0, "idempotency_key": k} for k in keys]
    return Envelope(orjson.dumps(conv), "test")


def test_inline_outcomes_and_their_links_are_copied_once_whoever_races(pg_url, monkeypatch) -> None:
    """New inline outcomes and their links are COPYed; a known key, or one another writer stores between
    the check and the COPY, sends the rows through the upsert: each key is stored and linked once."""
    from vigil.app.wiring import wire
    from vigil.store.models import OutcomeLinkRow, OutcomeRow

    rt = wire(build_runtime(make_settings(pg_url), registry=CollectorRegistry(), roles=("consume",)), {"consume"})
    try:
        rt.pipeline.process_raw([_with_outcomes("o", 1, ["k1"])])
        rt.pipeline.process_raw([_with_outcomes("o", 2, ["k1", "k2"])])  # k1 is known: the upsert keeps one

        copy = writes._pg_copy
        raced: list[str] = []

        def racing_copy(session, table, rows, into=None):  # type: ignore[no-untyped-def]
            if table.name == "outcomes" and not raced:
                raced.append("k3")  # another writer stores k3 after the check, before the COPY
                with rt.engine.begin() as other:
                    other.execute(OutcomeRow.__table__.insert(), [{**rows[0], "idempotency_key": "k3"}])
            return copy(session, table, rows, into)

        monkeypatch.setattr(writes, "_pg_copy", racing_copy)
        rt.pipeline.process_raw([_with_outcomes("p", 1, ["k3", "k4"])])
        assert raced == ["k3"]
        with rt.sessions() as s:
            keys = sorted(s.scalars(select(OutcomeRow.idempotency_key)).all())
            assert keys == ["k1", "k2", "k3", "k4"]
            linked = s.execute(select(OutcomeLinkRow.conversation_id, OutcomeLinkRow.outcome_id)).all()
            assert sorted(cid for cid, _ in linked) == ["o", "o", "p", "p"]
            assert len({oid for _, oid in linked}) == 4
    finally:
        rt.close()
