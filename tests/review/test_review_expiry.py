"""How the review queue ages out (SQLite and Postgres): an open item that expires leaves one ``expired`` audit
event behind, itself kept ``retention_expired_review_days``."""

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
