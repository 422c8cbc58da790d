"""Review API replicas whose host clocks disagree keep each other's claims, on SQLite and Postgres.

A replica's clock running ahead or behind is simulated by patching ``vigil.store.db.datetime`` (what
``utcnow`` reads) while it answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.review.test_review_api import RAJ, _seed
from tests.support.app import REVIEWER
from tests.support.clocks import skewed
from tests.support.review import queue_of
from vigil.store import db


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
