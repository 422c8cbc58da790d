"""How the review queue ages out (SQLite and Postgres): an open item that expires leaves one ``expired`` audit
event behind (itself kept ``retention_expired_review_days``), and an assignment nobody acts on is released
after ``review_assignment_timeout_hours`` so the item can expire."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from sqlalchemy import select, text, update

from tests.support.app import ADMIN, INGEST, REVIEWER
from tests.support.review import simulated
from vigil.store import retention
from vigil.store.models import ReviewItemRow

RAJ = {"Authorization": "Bearer raj-key"}
OLD = datetime.now(UTC) - timedelta(days=100)  # past VIGIL_RETENTION_OPEN_REVIEW_DAYS (90)


def _open_items(api, rt, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    """``n`` open items the flagger queued, each flagged 100 days ago (their conversations stay: received now)."""
    assert api.post("/v1/conversations", json=simulated(40, "v1:0.6"), headers=INGEST).status_code == 202
    with rt.sessions.begin() as s:
        ids = list(
            s.scalars(
                select(ReviewItemRow.conversation_id)
                .where(ReviewItemRow.status == "open")
                .order_by(ReviewItemRow.conversation_id)
                .limit(n)
            )
        )
        s.execute(update(ReviewItemRow).values(created_at=datetime.now(UTC)))
        s.execute(update(ReviewItemRow).where(ReviewItemRow.conversation_id.in_(ids)).values(created_at=OLD))
    assert len(ids) == n
    return ids


def _worked_on(api, cid: str) -> None:  # type: ignore[no-untyped-def]
    """What reviewers may do to an item without labelling it, leaving it free for retention."""
    assert api.post(f"/v1/review/items/{cid}/claim", headers=RAJ).status_code == 200
    assert api.post(f"/v1/review/items/{cid}/comments", json={"body": "refund?"}, headers=RAJ).status_code == 201
    assert api.post(f"/v1/review/items/{cid}/release", headers=RAJ).status_code == 204
    assert api.post(f"/v1/review/items/{cid}/skip", headers=REVIEWER).status_code == 204
    for action in ({"action": "assign", "assignee": "raj"}, {"action": "unassign"}):
        r = api.post("/v1/review/bulk", json={**action, "conversation_ids": [cid]}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["done"] == [cid], r.text


def _audit(api, **params: Any) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    r = api.get("/v1/review/audit", params=params, headers=ADMIN)
    assert r.status_code == 200, r.text
    return list(r.json())


def _rows(rt, table: str, cid: str) -> int:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return int(s.scalar(text(f"SELECT count(*) FROM {table} WHERE conversation_id = :c"), {"c": cid}) or 0)


def test_an_expired_item_leaves_one_audit_event_saying_what_happened_to_it(api, rt) -> None:  # type: ignore[no-untyped-def]
    """An open item past ``retention_open_review_days`` took every audit event of it along (enqueued, claim,
    comment, release, skip, assign, unassign), with its reasons and skips: nobody could tell afterwards that
    it had been queued, who had looked at it, or why it left. It now leaves one ``expired`` event with the
    item's reasons, when it was flagged and expired, and what reviewers did to it; its other events, reasons
    and skips go (what retention bounds), and the comment goes with the conversation, as before."""
    cid, untouched = _open_items(api, rt, 2)
    _worked_on(api, cid)
    events = _audit(api, conversation_id=cid)
    assert {e["action"] for e in events} == {"enqueued", "claim", "comment", "release", "skip", "assign", "unassign"}
    assert _rows(rt, "review_reasons", cid) >= 1 and _rows(rt, "review_skips", cid) == 1

    done = retention.run(rt.sessions, rt.settings)
    assert done.deleted["open_review_items"] == 2
    assert _rows(rt, "review_items", cid) == 0
    assert _rows(rt, "review_reasons", cid) == _rows(rt, "review_skips", cid) == 0
    assert _rows(rt, "review_comments", cid) == 1  # the conversation is still stored: its comments with it

    (event,) = _audit(api, conversation_id=cid)
    assert (event["actor"], event["action"]) == ("retention", "expired")
    d = event["detail"]
    assert datetime.fromisoformat(d["flagged_at"]) == OLD
    assert datetime.fromisoformat(d["expired_at"]) == datetime.fromisoformat(event["at"])
    assert d["after_days"] == 90.0
    assert d["reasons"] and all(kind in {"finding", "judge_fail", "outcome", "sample"} for kind, _key in d["reasons"])
    assert d["events"] == {
        "enqueued": 1, "claim": 1, "comment": 1, "release": 1, "skip": 1, "assign": 1, "unassign": 1
    }  # fmt: skip
    assert d["reviewers"] == ["admin", "raj", "rita"]
    assert datetime.fromisoformat(d["last_activity_at"]) <= datetime.fromisoformat(event["at"])

    (quiet,) = _audit(api, conversation_id=untouched)
    assert quiet["detail"]["events"] == {"enqueued": 1} and quiet["detail"]["reviewers"] == []
    assert quiet["detail"]["last_activity_at"] is None

    hist = api.get(f"/v1/review/items/{cid}/history", headers=REVIEWER).json()
    assert [e["action"] for e in hist["audit"]] == ["expired"]
    _ui_login(api, "rita-key")
    page = api.get(f"/ui/review/{quote(cid, safe='')}")
    assert page.status_code == 200
    shown = re.search(r'<span class="expired-record">(.*?)</span>', page.text, re.S)
    assert shown, "the conversation page shows no expired record"
    assert "left the queue unreviewed 90.0 days after it was flagged" in shown.group(1)
    assert "1 assign, 1 claim, 1 comment" in shown.group(1) and shown.group(1).endswith("by admin, raj, rita)")


def test_expired_records_go_after_their_own_retention(api, rt) -> None:  # type: ignore[no-untyped-def]
    """The record is one small row per expired item, bounded in its turn: ``retention_expired_review_days``
    after the item expired it is deleted (0 keeps records forever); other audit events stay."""
    (cid,) = _open_items(api, rt, 1)
    retention.run(rt.sessions, rt.settings)
    assert [e["action"] for e in _audit(api, conversation_id=cid)] == ["expired"]
    before = len(_audit(api, limit=1000))

    later = datetime.now(UTC) + timedelta(days=rt.settings.retention_expired_review_days + 1)
    forever = rt.settings.model_copy(update={"retention_expired_review_days": 0.0})
    assert "expired_review_records" not in retention.run(rt.sessions, forever, now=later).deleted
    assert [e["action"] for e in _audit(api, conversation_id=cid)] == ["expired"]

    dry = retention.run(rt.sessions, rt.settings, dry_run=True, now=later)
    assert dry.deleted["expired_review_records"] == 1
    done = retention.run(rt.sessions, rt.settings, now=later)
    assert done.deleted["expired_review_records"] == 1
    assert _audit(api, conversation_id=cid) == []
    assert len(_audit(api, limit=1000)) == before - 1


def _ui_login(api, key: str) -> None:  # type: ignore[no-untyped-def]
    csrf = re.search(r'name="csrf" value="([^"]+)"', api.get("/ui/login").text)
    assert csrf, "no CSRF token on the log-in page"
    r = api.post("/ui/login", data={"csrf": csrf.group(1), "api_key": key}, follow_redirects=False)
    assert r.status_code == 303, r.text


def _assign(api, rt, cid: str, to: str, hours_ago: float) -> None:  # type: ignore[no-untyped-def]
    r = api.post("/v1/review/bulk", json={"action": "assign", "assignee": to, "conversation_ids": [cid]}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["done"] == [cid], r.text
    at = datetime.now(UTC) - timedelta(hours=hours_ago)
    with rt.sessions.begin() as s:
        s.execute(update(ReviewItemRow).where(ReviewItemRow.conversation_id == cid).values(assigned_at=at))
        s.execute(text("UPDATE review_audit SET at = :at WHERE conversation_id = :c"), {"at": at, "c": cid})


def _assignees(rt, *ids: str) -> dict[str, str | None]:  # type: ignore[no-untyped-def]
    """The assignee of each of ``ids`` still in the queue."""
    with rt.sessions() as s:
        rows = s.execute(
            select(ReviewItemRow.conversation_id, ReviewItemRow.assignee).where(ReviewItemRow.conversation_id.in_(ids))
        )
        return {cid: assignee for cid, assignee in rows}


def test_an_assignment_nobody_acts_on_is_released_and_the_item_can_expire(api, rt) -> None:  # type: ignore[no-untyped-def]
    """An item assigned to a reviewer never left the queue until someone unassigned it: a reviewer who left
    kept their items, and their conversations, for good. After ``review_assignment_timeout_hours`` without an
    event of the assignee on the item, the retention job releases the assignment (an ``assignment_timeout``
    event, counted in ``vigil_review_assignments_timed_out_total``), and the item expires as any other; an
    assignee who claimed or commented since, or a younger assignment, keeps it. 0 never releases."""
    abandoned, busy, recent = _open_items(api, rt, 3)
    timeout = rt.settings.review_assignment_timeout_hours
    assert timeout == 14 * 24
    _assign(api, rt, abandoned, "raj", timeout + 1)
    _assign(api, rt, busy, "raj", timeout + 1)
    _assign(api, rt, recent, "rita", timeout - 1)
    assert api.post(f"/v1/review/items/{busy}/comments", json={"body": "on it"}, headers=RAJ).status_code == 201

    never = rt.settings.model_copy(update={"review_assignment_timeout_hours": 0.0})
    done = retention.run(rt.sessions, never, metrics=rt.metrics)
    assert done.released == {} and done.deleted["open_review_items"] == 0
    assert retention.run(rt.sessions, rt.settings, dry_run=True).released == {"assignments": 1}
    assert _assignees(rt, abandoned, busy, recent) == {abandoned: "raj", busy: "raj", recent: "rita"}

    done = retention.run(rt.sessions, rt.settings, metrics=rt.metrics)
    assert done.released == {"assignments": 1} and done.deleted["open_review_items"] == 1
    assert _assignees(rt, abandoned, busy, recent) == {busy: "raj", recent: "rita"}
    timed_out = rt.metrics.registry.get_sample_value("vigil_review_assignments_timed_out_total")
    assert timed_out == 1.0
    (expired,) = _audit(api, conversation_id=abandoned)
    assert expired["action"] == "expired" and expired["detail"]["events"]["assignment_timeout"] == 1
    released = _audit(api, action="assignment_timeout")
    assert [(e["conversation_id"], e["actor"]) for e in released] == []  # summed up in the expired record

    with rt.sessions.begin() as s:  # a young item: released, it stays in the queue for anyone
        s.execute(
            update(ReviewItemRow).where(ReviewItemRow.conversation_id == busy).values(created_at=datetime.now(UTC))
        )
        s.execute(text("UPDATE review_audit SET at = :at WHERE conversation_id = :c"), {"at": OLD, "c": busy})
    assert retention.run(rt.sessions, rt.settings, metrics=rt.metrics).released == {"assignments": 1}
    assert _assignees(rt, abandoned, busy, recent) == {busy: None, recent: "rita"}
    (event,) = _audit(api, action="assignment_timeout")
    assert (event["conversation_id"], event["actor"]) == (busy, "retention")
    assert event["detail"]["assignee"] == "raj" and event["detail"]["after_hours"] == timeout
    assert datetime.fromisoformat(event["detail"]["last_activity_at"]) == OLD
    assert rt.metrics.registry.get_sample_value("vigil_review_assignments_timed_out_total") == 2.0
    hist = api.get(f"/v1/review/items/{busy}/history", headers=REVIEWER).json()
    assert hist["audit"][-1]["action"] == "assignment_timeout"
    _ui_login(api, "rita-key")
    shown = re.search(r'<span class="timeout-record">(.*?)</span>', api.get(f"/ui/review/{quote(busy, safe='')}").text)
    assert shown and shown.group(1) == "(released raj's assignment: nothing from them on it for 336.0 hours)"


def test_a_conversation_that_expires_twice_keeps_both_records(api, rt) -> None:  # type: ignore[no-untyped-def]
    """A conversation flagged again after its item expired, whose new item expired too, lost the first
    ``expired`` record with the second item's audit events (it counted only as one more event of the item):
    each record stays until its own retention."""
    (cid,) = _open_items(api, rt, 1)
    retention.run(rt.sessions, rt.settings)
    with rt.sessions.begin() as s:
        s.add(ReviewItemRow(conversation_id=cid, agent_id="support-bot", agent_version="v1", created_at=OLD))
    assert api.post(f"/v1/review/items/{cid}/skip", headers=REVIEWER).status_code == 204
    assert retention.run(rt.sessions, rt.settings).deleted["open_review_items"] == 1
    first, second = reversed(_audit(api, conversation_id=cid))
    assert (first["action"], second["action"]) == ("expired", "expired")
    assert first["detail"]["events"] == {"enqueued": 1} and second["detail"]["events"] == {"skip": 1}
