"""Retention deletes what is past each table's retention and keeps what review, export and calibration
still need; the rollups keep counting the deleted period (SQLite and Postgres)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import delete, func, select, text, update
from typer.testing import CliRunner

from tests.compare.test_compare_api import verdict_row
from tests.support.app import INGEST, make_client, make_settings
from tests.support.clocks import skewed
from tests.support.traffic import clean, with_defect
from vigil.app.runtime import build_runtime
from vigil.store import retention, rollup_job, rollups
from vigil.store.models import (
    ConversationRow,
    DeadLetterRow,
    FindingRow,
    OutcomeLinkRow,
    OutcomeRow,
    ReviewItemRow,
    ReviewLabelRow,
    VerdictRow,
)
from vigil.store.rollups import RollupMemberRow

OLD = datetime.now(UTC) - timedelta(days=100)


@pytest.fixture
def aged(db_url):  # type: ignore[no-untyped-def]
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    with make_client(rt) as c:
        old = with_defect(20, "v1", "cancel_delivered", 1)
        new = clean(10, "v1", 2)
        assert c.post("/v1/conversations", json=old + new, headers=INGEST).status_code == 202
        ids = [x["conversation_id"] for x in old]
        labelled, queued, exported = ids[0], ids[1], ids[2]
        with rt.sessions.begin() as s:
            s.execute(delete(ReviewItemRow))  # the flagger queued the defects; this test queues one itself
            s.execute(update(ConversationRow).where(ConversationRow.conversation_id.in_(ids)).values(received_at=OLD))
            s.execute(update(FindingRow).where(FindingRow.conversation_id.in_(ids)).values(created_at=OLD))
            s.add(
                ReviewLabelRow(
                    conversation_id=labelled, reviewer="rita", label="confirmed_failure", version=1, is_current=True
                )
            )
            s.add(ReviewItemRow(conversation_id=queued, agent_id="support-bot", agent_version="v1", status="open"))
            s.execute(
                text(
                    "INSERT INTO exported_tasks (format, conversation_id, revision, task_id, group_key, run_id, "
                    "emitted, created_at) VALUES ('inspect', :cid, 1, 't', 'g', 1, :yes, :at)"
                ),
                {"cid": exported, "yes": True, "at": OLD},
            )
            old_verdict = verdict_row(ids[5], "v1", "fail")
            old_verdict.created_at = OLD - timedelta(days=100)  # verdicts are kept 180 days
            s.add_all([old_verdict, verdict_row(ids[0], "v1", "fail")])
            s.add_all(
                [
                    DeadLetterRow(source="http", reason="bad", detail="", raw=b"x", raw_size=1, created_at=at)
                    for at in (OLD, datetime.now(UTC) - timedelta(days=13), datetime.now(UTC) - timedelta(days=1))
                ]
            )
        rollup_job.refresh(rt.sessions, lag_seconds=0)
        yield rt, ids, {labelled, queued, exported}
    rt.close()


def _count(rt, model) -> int:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return int(s.scalar(select(func.count()).select_from(model)) or 0)


def test_retention_deletes_old_rows_and_keeps_what_others_need(aged) -> None:  # type: ignore[no-untyped-def]
    rt, ids, kept = aged
    with rt.sessions() as s:
        before = rollups.version_counts(s, "support-bot", "v1")
    assert before.conversations == 30 and before.forbidden == 20
    findings_before = _count(rt, FindingRow)

    dry = retention.run(rt.sessions, rt.settings, dry_run=True)
    assert dry.deleted["conversations"] == 17 and dry.deleted["dead_letters"] == 1
    assert _count(rt, ConversationRow) == 30 and _count(rt, FindingRow) == findings_before

    done = retention.run(rt.sessions, rt.settings)
    assert done.deleted["conversations"] == 17 and done.deleted["dead_letters"] == 1 and done.deleted["verdicts"] == 1
    with rt.sessions() as s:
        left = set(s.scalars(select(ConversationRow.conversation_id)))
        assert left & set(ids) == kept and len(left) == 13
        assert set(s.scalars(select(FindingRow.conversation_id))) & set(ids) == kept
        assert set(s.scalars(select(RollupMemberRow.conversation_id))) & set(ids) == kept
        assert [v for v in s.scalars(select(VerdictRow.conversation_id))] == [ids[0]]
        # the rollups keep counting the period whose raw rows are gone
        after = rollups.version_counts(s, "support-bot", "v1")
    assert (after.conversations, after.forbidden) == (before.conversations, before.forbidden)
    assert _count(rt, DeadLetterRow) == 2
    assert retention.run(rt.sessions, rt.settings).deleted["conversations"] == 0

    # a refresh after retention leaves the frozen hours alone
    rollup_job.refresh(rt.sessions, lag_seconds=0, frozen_before=partial(retention.frozen_before, rt.settings))
    with rt.sessions() as s:
        assert rollups.version_counts(s, "support-bot", "v1").conversations == 30


def test_retention_zero_keeps_everything_and_cli_dry_run(aged, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from vigil.app.cli import app

    rt, _ids, _kept = aged
    monkeypatch.setenv("VIGIL_DATABASE_URL", rt.settings.database_url_str)
    monkeypatch.setenv("VIGIL_RETENTION_CONVERSATIONS_DAYS", "0")
    r = CliRunner().invoke(app, ["retention", "run", "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    body = json.loads(r.stdout.strip().splitlines()[-1])
    assert body["dry_run"] and "conversations" not in body["deleted"] and body["deleted"]["dead_letters"] == 1
    monkeypatch.setenv("VIGIL_RETENTION_DEAD_LETTERS_DAYS", "0")
    r = CliRunner().invoke(app, ["retention", "run"])
    assert r.exit_code == 0, r.output
    assert _count(rt, ConversationRow) == 30 and _count(rt, DeadLetterRow) == 3


def test_a_conversation_enqueued_after_the_pick_is_kept_and_counts_are_rows_deleted(aged, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The pick and the delete are two statements. A conversation enqueued for review between them (by
    another process) was deleted all the same, leaving an open item whose conversation was gone; and two
    replicas deleting the same batch both counted it (2,961 + 3,500 reported for 3,861 rows)."""
    rt, ids, kept = aged
    late = ids[3]
    real = retention._batches
    picked: list[list[str]] = []

    def pick_then_enqueue(sessions, pick, remove, batch, dry_run):  # type: ignore[no-untyped-def]
        def enqueue_after_pick(s, keys):  # type: ignore[no-untyped-def]
            picked.append(list(keys))
            if late in keys:
                with rt.sessions.begin() as other:  # a reviewer, in another transaction
                    other.add(
                        ReviewItemRow(conversation_id=late, agent_id="support-bot", agent_version="v1", status="open")
                    )
            first = remove(s, keys)
            assert remove(s, keys) == 0  # a second replica deleting the same keys deletes (and counts) none
            return first

        return real(sessions, pick, enqueue_after_pick, batch, dry_run)

    monkeypatch.setattr(retention, "_batches", pick_then_enqueue)
    done = retention.run(rt.sessions, rt.settings)
    assert any(late in keys for keys in picked)
    assert done.deleted["conversations"] == 16  # 17 past retention, one of them enqueued meanwhile
    with rt.sessions() as s:
        left = set(s.scalars(select(ConversationRow.conversation_id)))
        assert left & set(ids) == kept | {late}
        assert late in set(s.scalars(select(FindingRow.conversation_id)))  # its findings too


@pytest.mark.parametrize("days", ["1000000", "1e308", "inf"])
def test_a_retention_longer_than_any_time_keeps_everything(aged, monkeypatch, days) -> None:  # type: ignore[no-untyped-def]
    """A retention of a million days (or ``inf``) overflowed the date: ``vigil retention run`` failed with an
    OverflowError, and so did every rollup job and every compare read's catch-up, which freeze old hours
    by the same cutoff."""
    from vigil.app.cli import app
    from vigil.store.maintenance import refresh_rollups

    rt, _ids, _kept = aged
    monkeypatch.setenv("VIGIL_DATABASE_URL", rt.settings.database_url_str)
    for name in (
        "CONVERSATIONS",
        "UNJOINED_OUTCOMES",
        "FINDINGS",
        "VERDICTS",
        "DEAD_LETTERS",
        "OPEN_REVIEW",
        "EXPIRED_REVIEW",
    ):
        monkeypatch.setenv(f"VIGIL_RETENTION_{name}_DAYS", days)
    r = CliRunner().invoke(app, ["retention", "run", "--json"])
    assert r.exit_code == 0, r.output
    body = json.loads(r.stdout.strip().splitlines()[-1])
    assert body["deleted"] == {} and set(body["cutoffs"].values()) == {None}
    assert _count(rt, ConversationRow) == 30 and _count(rt, DeadLetterRow) == 3
    settings = rt.settings.model_copy(update={"retention_conversations_days": float(days)})
    assert retention.frozen_before(settings, datetime.now(UTC)) is None
    assert refresh_rollups(settings, rt.sessions).ran


def test_hours_retention_deleted_from_keep_their_counts_whatever_the_settings_of_the_rollup_job(aged) -> None:  # type: ignore[no-untyped-def]
    """The rollup job froze hours by its own process's retention setting only. After a run by hand with a
    shorter retention (or by a replica whose clock ran ahead, or in the cutoff's own hour), a kept
    conversation stored again had its old hour recomputed from what retention left: at 1M conversations
    one new revision took its hour from 963 conversations to 316 on compare."""
    from vigil.store.maintenance import refresh_rollups

    rt, ids, kept = aged
    old_hour = rollups.hour_of(OLD)
    with rt.sessions() as s:
        assert rollups.hourly_series(s, "support-bot", "v1", rollups.CONVERSATIONS, old_hour)[old_hour] == (20, 0)
    assert retention.run(rt.sessions, rt.settings).deleted["conversations"] == 17  # a one-off run of 90 days
    forever = rt.settings.model_copy(update={"retention_conversations_days": 0.0})  # serve keeps everything

    again = with_defect(20, "v1", "cancel_delivered", 1)[0]
    assert again["conversation_id"] == ids[0] and ids[0] in kept
    again["revision"] = 2
    with make_client(rt) as c:
        assert c.post("/v1/conversations", json=[again], headers=INGEST).status_code == 202
    refresh_rollups(forever.model_copy(update={"rollup_lag_seconds": 0.0}), rt.sessions)
    with rt.sessions() as s:
        series = rollups.hourly_series(s, "support-bot", "v1", rollups.CONVERSATIONS, old_hour)
    assert series[old_hour] == (20, 0)


def test_a_conversation_enqueued_while_its_delete_runs_is_kept(aged, request) -> None:  # type: ignore[no-untyped-def]
    """A reviewer's enqueue still in flight when retention's DELETE ran committed an open item whose
    conversation was gone: the DELETE saw no item (measured on 1M conversations: even a row lock held by the
    enqueue only made the DELETE wait, then delete)."""
    import threading

    from tests.support.waiting import wait_for
    from vigil.review.flagger import enqueue
    from vigil.review.policy import FlaggingPolicy, Reason

    rt, ids, kept = aged
    if rt.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time: the enqueue and the delete cannot overlap")
    late = ids[3]
    reviewer = rt.sessions()
    reviewer.begin()
    enqueue(reviewer, FlaggingPolicy(), {late: [Reason("manual", "rita", 1.0, "")]}, {late: ("support-bot", "v1")})
    done: list[retention.RetentionResult] = []
    worker = threading.Thread(target=lambda: done.append(retention.run(rt.sessions, rt.settings)))
    worker.start()

    def deleting_or_done() -> bool:
        if not worker.is_alive():
            return True
        with rt.engine.connect() as conn:
            return bool(conn.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")))

    wait_for(deleting_or_done, what="retention waiting on the enqueued conversation, or done")
    reviewer.commit()
    reviewer.close()
    worker.join()
    assert done[0].deleted["conversations"] == 16
    with rt.sessions() as s:
        left = set(s.scalars(select(ConversationRow.conversation_id)))
        assert left & set(ids) == kept | {late}
        assert s.scalar(select(ReviewItemRow.status).where(ReviewItemRow.conversation_id == late)) == "open"


def test_enqueueing_a_conversation_retention_is_deleting_answers_404(aged) -> None:  # type: ignore[no-untyped-def]
    """POST /v1/review/items found the conversation, then waited on its row while retention deleted it, and
    answered 201 with an item waiting for a conversation that was gone (3 of 554 enqueues at the edge of a
    retention run over 160k conversations)."""
    import threading

    from tests.support.app import REVIEWER
    from tests.support.waiting import wait_for

    rt, ids, _kept = aged
    if rt.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time: the enqueue and the delete cannot overlap")
    doomed = ids[4]
    deleting = rt.engine.connect()
    deleting.begin()
    deleting.execute(delete(ConversationRow).where(ConversationRow.conversation_id == doomed))
    answers: list[int] = []
    with make_client(rt) as c:
        body = {"conversation_id": doomed, "note": "look"}
        worker = threading.Thread(
            target=lambda: answers.append(c.post("/v1/review/items", json=body, headers=REVIEWER).status_code)
        )
        worker.start()

        def waiting_or_done() -> bool:
            with rt.engine.connect() as conn:
                return not worker.is_alive() or bool(
                    conn.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"))
                )

        wait_for(waiting_or_done, what="the enqueue waiting on the row being deleted")
        deleting.commit()
        deleting.close()
        worker.join()
    assert answers == [404]
    with rt.sessions() as s:
        assert s.scalar(select(ReviewItemRow).where(ReviewItemRow.conversation_id == doomed)) is None


def test_outcomes_go_with_their_conversation_and_unjoined_ones_after_their_retention(aged) -> None:  # type: ignore[no-untyped-def]
    """Retention deleted conversations and their outcome links but never an outcome: every outcome stayed,
    those of deleted conversations, those whose conversation never came (and the review items they left
    waiting for it), so ``outcomes`` grew by 0.42 rows per conversation forever."""
    rt, ids, kept = aged
    fresh = ids[19]  # one of the old ones, stored again: its outcome stays
    with rt.sessions.begin() as s:
        again = update(ConversationRow).where(ConversationRow.conversation_id == fresh)
        s.execute(again.values(received_at=datetime.now(UTC)))
    orphan = ids[18]  # deleted before retention deleted outcomes: its outcome has been waiting since
    with rt.sessions.begin() as s:
        s.execute(delete(ConversationRow).where(ConversationRow.conversation_id == orphan))
    good = [{"conversation_id": cid, "type": "task_success", "value": 1.0} for cid in ids]  # flags nothing
    early = [
        {"conversation_id": "never-came", "type": "escalation"},  # flags an item that waits for the conversation
        {"conversation_id": "never-came-either", "type": "task_success", "value": 1.0},
        {"conversation_id": "comes-later", "type": "escalation"},  # received lately: waits on
    ]
    with make_client(rt) as c:
        assert c.post("/v1/outcomes", json=good + early, headers=INGEST).status_code == 202
    with rt.sessions.begin() as s:
        old = OutcomeRow.conversation_id != "comes-later"
        s.execute(update(OutcomeRow).where(old).values(received_at=OLD, occurred_at=OLD))
        waiting = select(ReviewItemRow.conversation_id).where(ReviewItemRow.agent_id.is_(None))
        assert set(s.scalars(waiting)) == {"never-came", "comes-later"}
        aged = ReviewItemRow.conversation_id != "comes-later"
        s.execute(update(ReviewItemRow).where(ReviewItemRow.agent_id.is_(None), aged).values(created_at=OLD))

    dry = retention.run(rt.sessions, rt.settings, dry_run=True)
    done = retention.run(rt.sessions, rt.settings)
    with rt.sessions() as s:
        left = set(s.scalars(select(OutcomeRow.conversation_id)))
        assert left == kept | {fresh, "comes-later"}
        assert set(s.scalars(select(OutcomeLinkRow.conversation_id))) == kept | {fresh}
        assert set(s.scalars(waiting)) == {"comes-later"}
        for hanging in ("review_reasons", "review_audit"):
            never = text(f"SELECT conversation_id FROM {hanging} WHERE conversation_id LIKE 'never%'")
            assert s.scalars(never).all() == []
    assert dry.deleted.get("unjoined_outcomes") == 3  # the orphan's and the two that never came
    assert done.deleted["conversations"] == 15 and done.deleted.get("unjoined_outcomes") == 3
    again = retention.run(rt.sessions, rt.settings)
    assert again.deleted["unjoined_outcomes"] == 0 and again.deleted["conversations"] == 0

    # the conversation that came later is joined, and its outcome stays with it however old it gets
    comes = dict(clean(1, "v1", 9)[0], conversation_id="comes-later")
    with make_client(rt) as c:
        assert c.post("/v1/conversations", json=[comes], headers=INGEST).status_code == 202
    with rt.sessions.begin() as s:
        s.execute(update(OutcomeRow).values(received_at=OLD))
        s.execute(
            update(rollups.RollupStateRow).where(rollups.RollupStateRow.name.like("%outcomes%")).values(watermark=None)
        )
    assert retention.run(rt.sessions, rt.settings).deleted["unjoined_outcomes"] == 0
    with rt.sessions() as s:
        assert set(s.scalars(select(OutcomeRow.conversation_id))) == kept | {fresh, "comes-later"}


def test_a_deleted_conversations_judge_requests_go_with_it(aged) -> None:  # type: ignore[no-untyped-def]
    """Retention deleted conversations but never their judge requests, pending or done: 201,500 requests per
    1M conversations stored, 19,500 of them of conversations long deleted, stayed forever
    (bench.bench_retention)."""
    rt, ids, kept = aged
    requests = text("SELECT DISTINCT conversation_id FROM judge_requests")
    with rt.sessions() as s:
        assert set(ids) <= set(s.scalars(requests))  # the flagger's defects: one request each
    assert retention.run(rt.sessions, rt.settings).deleted["conversations"] == 17
    with rt.sessions() as s:
        assert set(s.scalars(requests)) & set(ids) == kept


def _queue(s, cid: str, created_at: datetime, **values) -> None:  # type: ignore[no-untyped-def]
    s.add(
        ReviewItemRow(conversation_id=cid, agent_id="support-bot", agent_version="v1", created_at=created_at, **values)
    )


@pytest.fixture
def queued_long_ago(aged):  # type: ignore[no-untyped-def]
    """Open items nobody reviewed for 100 days: one free, one a reviewer holds now, one a double review
    half done; a finished one; and the fixture's own item queued today."""
    rt, ids, kept = aged
    labelled, young = ids[0], ids[1]
    expired, claimed, finished = ids[3], ids[4], ids[6]
    now = datetime.now(UTC)
    with rt.sessions.begin() as s:
        _queue(s, expired, OLD)
        _queue(s, claimed, OLD, claimed_by="rita", claimed_at=now, lease_until=now + timedelta(hours=1))
        _queue(s, labelled, OLD, required_reviews=2, review_count=1)
        _queue(s, finished, OLD, status="done", review_count=1)
        s.add(ReviewLabelRow(conversation_id=finished, reviewer="rita", label="not_a_failure", version=1))
    return rt, {"expired": expired, "claimed": claimed, "labelled": labelled, "finished": finished, "young": young}


def test_open_items_nobody_reviewed_expire_and_their_conversations_go(queued_long_ago) -> None:  # type: ignore[no-untyped-def]
    """With nobody reviewing, the flagger's open items pinned their conversations (with findings, verdicts and
    outcomes) forever: the queue and the database grew without bound. An open item past
    ``retention_open_review_days`` leaves the queue, and retention deletes its conversation as any other;
    what a reviewer holds, labelled, or finished stays, and so does a younger item."""
    rt, items = queued_long_ago
    assert rt.settings.retention_open_review_days == 90

    dry = retention.run(rt.sessions, rt.settings, dry_run=True)
    assert dry.deleted["open_review_items"] == 1
    assert _count(rt, ReviewItemRow) == 5

    done = retention.run(rt.sessions, rt.settings)
    assert done.deleted["open_review_items"] == 1 and done.cutoffs["open_review_items"] is not None
    with rt.sessions() as s:
        queued = set(s.scalars(select(ReviewItemRow.conversation_id)))
        stored = set(s.scalars(select(ConversationRow.conversation_id)))
        findings = set(s.scalars(select(FindingRow.conversation_id)))
    assert queued == set(items.values()) - {items["expired"]}
    assert items["expired"] not in stored and items["expired"] not in findings
    assert {items["claimed"], items["labelled"], items["finished"], items["young"]} <= stored
    assert retention.run(rt.sessions, rt.settings).deleted["open_review_items"] == 0


def test_open_review_retention_zero_keeps_queued_items_forever(queued_long_ago) -> None:  # type: ignore[no-untyped-def]
    rt, items = queued_long_ago
    forever = rt.settings.model_copy(update={"retention_open_review_days": 0.0})
    done = retention.run(rt.sessions, forever)
    assert "open_review_items" not in done.deleted and done.cutoffs["open_review_items"] is None
    with rt.sessions() as s:
        assert set(s.scalars(select(ReviewItemRow.conversation_id))) == set(items.values())
        assert items["expired"] in set(s.scalars(select(ConversationRow.conversation_id)))


def test_reviewers_comments_go_with_their_conversation(queued_long_ago) -> None:  # type: ignore[no-untyped-def]
    """Retention deleted a conversation but kept every comment reviewers wrote on it: free text about a
    conversation that no longer exists (and that a conversation stored again under its id showed as its own),
    kept forever. Comments go with their conversation, also one whose open item expired first; those on a
    conversation review, export or calibration keeps stay with it."""
    from vigil.review.triage import add_comment

    rt, items = queued_long_ago
    ids = [items["expired"], items["claimed"], items["labelled"], items["finished"], items["young"]]
    with rt.sessions() as s:
        plain = s.scalars(
            select(ConversationRow.conversation_id).where(
                ConversationRow.received_at < datetime.now(UTC) - timedelta(days=90),
                ConversationRow.conversation_id.not_in(ids),
                ~retention.kept(ConversationRow.conversation_id),
            )
        ).first()
    assert plain is not None
    with rt.sessions.begin() as s:
        for cid in [plain, *ids]:
            add_comment(s, cid, "rita", f"the customer's address is in message 2 of {cid}")
            add_comment(s, cid, "sam", "agreed", message_index=0)
    comments = text("SELECT DISTINCT conversation_id FROM review_comments")
    retention.run(rt.sessions, rt.settings)
    with rt.sessions() as s:
        stored = set(s.scalars(select(ConversationRow.conversation_id)))
        commented = set(s.scalars(comments))
    assert plain not in stored and items["expired"] not in stored
    assert commented == set(ids) - {items["expired"]}
    assert commented <= stored


def test_an_item_assigned_to_a_reviewer_stays_in_the_queue(queued_long_ago) -> None:  # type: ignore[no-untyped-def]
    """An open item someone assigned to a reviewer, who had not claimed it yet, expired after
    ``retention_open_review_days`` like one nobody looked at, and its conversation went with it: a person's
    decision that it needs a look vanished without a word. An assigned item stays (whether or not the
    assignment lapsed for claim-next), as a claimed one does; unassigned, it expires again."""
    rt, items = queued_long_ago
    assigned, lapsed = items["expired"], items["finished"]
    # past VIGIL_REVIEW_ASSIGNMENT_HOURS (anyone's to claim), inside VIGIL_REVIEW_ASSIGNMENT_TIMEOUT_HOURS (still
    # sam's: tests/review/test_review_expiry.py releases one past it)
    long_ago = datetime.now(UTC) - timedelta(days=5)
    with rt.sessions.begin() as s:
        s.execute(delete(ReviewItemRow).where(ReviewItemRow.conversation_id == lapsed))
        s.execute(delete(ReviewLabelRow).where(ReviewLabelRow.conversation_id == lapsed))
        _queue(s, lapsed, OLD, assignee="sam", assigned_at=long_ago)
        s.execute(
            update(ReviewItemRow)
            .where(ReviewItemRow.conversation_id == assigned)
            .values(assignee="rita", assigned_at=datetime.now(UTC))
        )

    assert retention.run(rt.sessions, rt.settings, dry_run=True).deleted["open_review_items"] == 0
    assert retention.run(rt.sessions, rt.settings).deleted["open_review_items"] == 0
    with rt.sessions() as s:
        queued = set(s.scalars(select(ReviewItemRow.conversation_id).where(ReviewItemRow.status == "open")))
        stored = set(s.scalars(select(ConversationRow.conversation_id)))
    assert {assigned, lapsed} <= queued and {assigned, lapsed} <= stored

    with rt.sessions.begin() as s:  # unassigned: nobody is meant to look at it any more
        s.execute(
            update(ReviewItemRow)
            .where(ReviewItemRow.conversation_id == assigned)
            .values(assignee=None, assigned_at=None)
        )
    assert retention.run(rt.sessions, rt.settings).deleted["open_review_items"] == 1
    with rt.sessions() as s:
        assert assigned not in set(s.scalars(select(ConversationRow.conversation_id)))


def test_a_batch_goes_to_postgres_as_one_array_not_a_parameter_per_row(aged) -> None:  # type: ignore[no-untyped-def]
    """A batch's DELETEs listed every picked id as a parameter of its own (``IN (%(id_1)s, ... 5,000)``):
    building and parsing those statements took half of a run's time in Python (19 of 39 s deleting 150,000
    conversations). In ``serve`` retention runs in a thread beside the requests, which waited on it for
    the interpreter: the review queue's pages took 2.5 times as long while it ran (``docs/benchmarks.md``).
    Now each batch's ids go as one array, whatever the batch's size."""
    from sqlalchemy import event

    rt, _ids, _kept = aged
    if rt.engine.dialect.name != "postgresql":
        pytest.skip("SQLite gets the ids inline (bounded by the batch size), there is no array type")
    issued: list[tuple[str, int]] = []

    def grab(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        issued.append((statement, len(parameters or ())))

    event.listen(rt.engine, "before_cursor_execute", grab)
    try:
        assert retention.run(rt.sessions, rt.settings).deleted["conversations"] == 17
    finally:
        event.remove(rt.engine, "before_cursor_execute", grab)
    deletes = [(stmt, n) for stmt, n in issued if stmt.lstrip().startswith("DELETE")]
    assert any("DELETE FROM conversations" in stmt for stmt, _ in deletes)
    assert all(n < 10 for _stmt, n in issued), max(issued, key=lambda x: x[1])


def test_a_run_on_a_clock_running_ahead_keeps_the_item_a_reviewer_holds(queued_long_ago, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Run on a host 3 h ahead, retention saw rita's live lease (1 h left) as run out and deleted the old
    item she was reviewing, with its conversation. It reads the database's clock now."""
    rt, items = queued_long_ago
    monkeypatch.setattr(retention, "datetime", skewed(3))
    assert retention.run(rt.sessions, rt.settings).deleted["open_review_items"] == 1  # the free one only
    with rt.sessions() as s:
        assert s.get(ConversationRow, items["claimed"]) is not None
        assert s.scalar(select(ReviewItemRow.claimed_by).where(ReviewItemRow.conversation_id == items["claimed"]))
