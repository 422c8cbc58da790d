"""Review API replicas whose host clocks disagree keep each other's claims, on SQLite and Postgres.

A replica's clock running ahead or behind is simulated by patching ``vigil.store.db.datetime`` (what
``utcnow`` reads) while it answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from tests.review.test_review_api import RAJ, _seed
from tests.support.app import ADMIN, REVIEWER
from tests.support.clocks import skewed
from tests.support.review import queue_of
from vigil.store import db, retention
from vigil.store.models import ReviewItemRow


def test_a_replica_whose_clock_runs_ahead_shows_and_keeps_another_reviewers_claim(api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A replica 3 h ahead showed an item rita claimed 10 minutes before as available and let raj claim it,
    label it or skip it while she reviewed it."""
    _seed(api, 20)
    cid = api.post("/v1/review/claim", headers=REVIEWER).json()["conversation_id"]
    monkeypatch.setattr(db, "datetime", skewed(3))
    item = api.get(f"/v1/review/items/{cid}", headers=RAJ).json()
    assert (item["state"], item["claimed_by"]) == ("claimed", "rita")
    assert cid in {i["conversation_id"] for i in queue_of(api, status="claimed")["items"]}
    assert cid not in {i["conversation_id"] for i in queue_of(api, status="available")["items"]}
    holding = {r["reviewer"]: r["holding"] for r in api.get("/v1/review/progress", headers=RAJ).json()["reviewers"]}
    assert holding.get("rita") == 1
    assert api.post(f"/v1/review/items/{cid}/claim", headers=RAJ).status_code == 409
    assert api.post("/v1/review/claim", headers=RAJ).json()["conversation_id"] != cid
    assert api.post(f"/v1/review/items/{cid}/labels", json={"label": "unsure"}, headers=RAJ).status_code == 409
    assert api.post(f"/v1/review/items/{cid}/skip", headers=RAJ).status_code == 409


def test_a_replica_whose_clock_runs_behind_writes_leases_the_others_respect(api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A claim (or an extension) through a replica 3 h behind wrote a lease that had run out 2 h 50 min
    before: every other replica offered the item to the next reviewer at once."""
    _seed(api, 20)
    monkeypatch.setattr(db, "datetime", skewed(-3))
    claimed = api.post("/v1/review/claim", headers=REVIEWER).json()
    cid = claimed["conversation_id"]
    extended = api.post(f"/v1/review/items/{cid}/extend", headers=REVIEWER).json()
    monkeypatch.setattr(db, "datetime", datetime)
    for lease in (claimed["lease_until"], extended["lease_until"]):
        assert datetime.fromisoformat(lease) > datetime.now(UTC) + timedelta(minutes=5)
    assert api.get(f"/v1/review/items/{cid}", headers=RAJ).json()["state"] == "claimed"
    assert api.post(f"/v1/review/items/{cid}/claim", headers=RAJ).status_code == 409


def test_an_assignee_working_through_a_replica_whose_clock_runs_behind_keeps_the_assignment(  # type: ignore[no-untyped-def]
    api, rt, monkeypatch
) -> None:
    """Retention releases an assignment with no event of the assignee since the timeout's cutoff, on the
    database's clock; an event written through a replica 3 h behind was stamped 3 h in the past, so raj's
    claim a moment ago looked older than a 2 h timeout and his assignment was released under him."""
    _seed(api, 20)
    cid = queue_of(api)["items"][0]["conversation_id"]
    assign = {"action": "assign", "assignee": "raj", "conversation_ids": [cid]}
    r = api.post("/v1/review/bulk", json=assign, headers=ADMIN)
    assert r.status_code == 200 and r.json()["done"] == [cid], r.text
    with rt.sessions.begin() as s:  # assigned 5 h ago
        s.execute(
            update(ReviewItemRow)
            .where(ReviewItemRow.conversation_id == cid)
            .values(assigned_at=datetime.now(UTC) - timedelta(hours=5))
        )
    monkeypatch.setattr(db, "datetime", skewed(-3))
    assert api.post(f"/v1/review/items/{cid}/claim", headers=RAJ).status_code == 200
    assert api.post(f"/v1/review/items/{cid}/release", headers=RAJ).status_code == 204
    monkeypatch.setattr(db, "datetime", datetime)
    two_hours = rt.settings.model_copy(update={"review_assignment_timeout_hours": 2.0})
    assert retention.run(rt.sessions, two_hours).released == {"assignments": 0}
    with rt.sessions() as s:
        assert s.scalar(select(ReviewItemRow.assignee).where(ReviewItemRow.conversation_id == cid)) == "raj"
