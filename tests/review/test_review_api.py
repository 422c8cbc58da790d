"""Review queue semantics through the API, on SQLite and on Postgres."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import update

from tests.support.app import ADMIN, INGEST, REVIEWER
from tests.support.review import queue_of, review_client, review_runtime, simulated
from vigil.store.models import ReviewItemRow, utcnow

RAJ = {"Authorization": "Bearer raj-key"}


def _seed(api, n: int = 40, seed: int = 7) -> list[dict]:  # type: ignore[no-untyped-def]
    convs = simulated(n, "v1:0.2,v2:0.7", seed=seed)
    assert api.post("/v1/conversations", json=convs, headers=INGEST).status_code == 202
    return convs


def test_flagged_conversations_are_queued_by_priority_with_counts_and_filters(api) -> None:
    convs = _seed(api)
    defective = {c["conversation_id"] for c in convs if c["metadata"]["simulated_defect"]}
    data = queue_of(api)
    ids = {it["conversation_id"] for it in data["items"]}
    flagged_by_rules = {
        it["conversation_id"] for it in data["items"] if any(r["kind"] == "finding" for r in it["reasons"])
    }
    assert flagged_by_rules and flagged_by_rules <= defective
    assert data["counts"]["available"] == len(ids) == data["total"]
    prios = [it["priority"] for it in data["items"]]
    assert prios == sorted(prios, reverse=True)
    assert data["reasons"]["finding"] == len(flagged_by_rules)

    v2 = queue_of(api, version="v2")
    assert v2["items"] and all(it["agent_version"] == "v2" for it in v2["items"])
    assert v2["counts"]["available"] + queue_of(api, version="v1")["counts"]["available"] == len(ids)
    pii = queue_of(api, rule="pii-in-reply")["items"]
    assert pii and all(any(r["key"] == "pii-in-reply" for r in it["reasons"]) for it in pii)
    assert queue_of(api, reason="outcome")["items"] == []
    assert queue_of(api, agent="nobody")["counts"]["all"] == 0
    # storing the same traffic again changes nothing
    _seed(api)
    assert queue_of(api)["counts"] == data["counts"]


def test_claim_extend_release_skip(api, rt) -> None:
    _seed(api)
    r1 = api.post("/v1/review/claim", headers=REVIEWER)
    assert r1.status_code == 200
    first = r1.json()
    cid = first["conversation_id"]
    assert first["item"]["claimed_by"] == "rita" and first["item"]["state"] == "claimed"
    top = queue_of(api, status="all")["items"][0]
    assert top["conversation_id"] == cid  # the highest priority went first

    r2 = api.post("/v1/review/claim", headers=RAJ).json()
    assert r2["conversation_id"] != cid
    assert api.post(f"/v1/review/items/{cid}/claim", headers=RAJ).status_code == 409
    assert api.post(f"/v1/review/items/{cid}/extend", headers=RAJ).status_code == 409
    assert api.post(f"/v1/review/items/{cid}/release", headers=RAJ).status_code == 409
    ext = api.post(f"/v1/review/items/{cid}/extend", headers=REVIEWER)
    assert ext.status_code == 200 and ext.json()["lease_until"] >= first["lease_until"]
    assert queue_of(api, status="claimed")["counts"]["claimed"] == 2

    # claiming next gives back the claim you held
    r3 = api.post("/v1/review/claim", headers=REVIEWER).json()
    assert r3["conversation_id"] not in (cid, r2["conversation_id"])
    assert api.get(f"/v1/review/items/{cid}", headers=REVIEWER).json()["state"] == "available"

    nxt = r3["conversation_id"]
    assert api.post(f"/v1/review/items/{nxt}/release", headers=REVIEWER).status_code == 204
    assert api.get(f"/v1/review/items/{nxt}", headers=REVIEWER).json()["state"] == "available"

    # skip: rita is never offered it again, raj still is
    assert api.post(f"/v1/review/items/{nxt}/skip", headers=REVIEWER).status_code == 204
    offered = set()
    while (r := api.post("/v1/review/claim", json={"release_others": False}, headers=REVIEWER)).status_code == 200:
        offered.add(r.json()["conversation_id"])
    assert r.status_code == 204 and nxt not in offered
    api.post(f"/v1/review/items/{r2['conversation_id']}/release", headers=RAJ)
    assert api.post(f"/v1/review/items/{nxt}/claim", headers=RAJ).status_code == 200

    assert api.post("/v1/review/items/nope/claim", headers=RAJ).status_code == 404
    # admins may force a release
    assert api.post(f"/v1/review/items/{nxt}/release?force=true", headers=REVIEWER).status_code == 403
    assert api.post(f"/v1/review/items/{nxt}/release?force=true", headers=ADMIN).status_code == 204


def test_a_forced_release_says_whose_claim_it_was_and_one_of_nothing_is_refused(api) -> None:
    _seed(api, 20)
    cid = api.post("/v1/review/claim", headers=RAJ).json()["conversation_id"]
    assert api.post(f"/v1/review/items/{cid}/release?force=true", headers=ADMIN).status_code == 204
    assert api.get(f"/v1/review/items/{cid}", headers=ADMIN).json()["claimed_by"] is None

    def releases() -> list[dict]:
        audit = api.get("/v1/review/audit", params={"conversation_id": cid}, headers=ADMIN).json()
        return [e for e in audit if e["action"] == "release"]

    [event] = releases()
    assert (event["actor"], event["detail"]) == ("admin", {"forced": True, "claimed_by": "raj"})
    # nobody holds it now: a forced release answers 409 as any release of nothing does, and writes nothing
    again = api.post(f"/v1/review/items/{cid}/release?force=true", headers=ADMIN)
    assert again.status_code == 409 and "nobody holds this item" in again.json()["detail"]
    assert api.post(f"/v1/review/items/{cid}/release", headers=RAJ).status_code == 409
    assert len(releases()) == 1
    assert api.post("/v1/review/items/nope/release?force=true", headers=ADMIN).status_code == 404


def test_lease_expiry_returns_the_item(api, rt) -> None:
    _seed(api, 20)
    cid = api.post("/v1/review/claim", headers=REVIEWER).json()["conversation_id"]
    assert api.post(f"/v1/review/items/{cid}/claim", headers=RAJ).status_code == 409
    with rt.sessions.begin() as s:
        s.execute(
            update(ReviewItemRow)
            .where(ReviewItemRow.conversation_id == cid)
            .values(lease_until=utcnow() - timedelta(seconds=1))
        )
    item = api.get(f"/v1/review/items/{cid}", headers=REVIEWER).json()
    assert item["state"] == "available" and item["claimed_by"] is None
    # raj's claim-next takes the expired item (it is still the highest priority)
    assert api.post("/v1/review/claim", headers=RAJ).json()["conversation_id"] == cid
    # rita's late extension fails: the item is raj's now
    assert api.post(f"/v1/review/items/{cid}/extend", headers=REVIEWER).status_code == 409
    assert api.post(f"/v1/review/items/{cid}/labels", json={"label": "unsure"}, headers=REVIEWER).status_code == 409


def test_a_label_clears_an_expired_claim_and_a_done_item_has_no_lease_to_extend(api, rt) -> None:
    _seed(api, 20)
    cid = api.post("/v1/review/claim", headers=RAJ).json()["conversation_id"]
    with rt.sessions.begin() as s:
        s.execute(
            update(ReviewItemRow)
            .where(ReviewItemRow.conversation_id == cid)
            .values(lease_until=utcnow() - timedelta(seconds=1))
        )
    # raj's lease ran out; rita labels the item, which finishes it and takes raj's stale claim away
    url = f"/v1/review/items/{cid}/labels"
    assert api.post(url, json={"label": "not_a_failure"}, headers=REVIEWER).status_code == 201
    with rt.sessions() as s:
        row = s.query(ReviewItemRow).filter_by(conversation_id=cid).one()
        assert (row.status, row.claimed_by, row.lease_until) == ("done", None, None)
    late = api.post(f"/v1/review/items/{cid}/extend", headers=RAJ)
    assert late.status_code == 409 and "is done" in late.json()["detail"]
    item = api.get(f"/v1/review/items/{cid}", headers=ADMIN).json()
    assert item["state"] == "done" and item["claimed_by"] is None and item["lease_until"] is None
    # rita may still change her label and skip; nobody holds the item against her
    relabel = {"label": "confirmed_failure", "category": "tone"}
    assert api.post(url, json=relabel, headers=REVIEWER).status_code == 201
    assert api.post(f"/v1/review/items/{cid}/skip", headers=REVIEWER).status_code == 204
    # a claim left on a done item (stored before this rule) cannot be extended either
    with rt.sessions.begin() as s:
        s.execute(
            update(ReviewItemRow)
            .where(ReviewItemRow.conversation_id == cid)
            .values(claimed_by="raj", lease_until=utcnow() - timedelta(seconds=1))
        )
    stale = api.post(f"/v1/review/items/{cid}/extend", headers=RAJ)
    assert stale.status_code == 409 and "is done" in stale.json()["detail"]
    assert api.post(url, json={"label": "unsure"}, headers=REVIEWER).status_code == 201


def test_labels_are_versioned_validated_and_release_the_claim(api) -> None:
    _seed(api)
    cid = api.post("/v1/review/claim", headers=REVIEWER).json()["conversation_id"]
    url = f"/v1/review/items/{cid}/labels"
    assert api.post(url, json={"label": "confirmed_failure"}, headers=REVIEWER).status_code == 422
    assert api.post(url, json={"label": "bad"}, headers=REVIEWER).status_code == 422
    bad_cat = api.post(url, json={"label": "confirmed_failure", "category": "nonsense"}, headers=REVIEWER)
    assert bad_cat.status_code == 422 and "taxonomy" in bad_cat.json()["detail"]
    assert api.post(url, json={"label": "unsure"}, headers=RAJ).status_code == 409  # rita holds it

    v1 = api.post(
        url,
        json={
            "label": "confirmed_failure",
            "category": "privacy_leak",
            "severity": "critical",
            "notes": "leaked the email",
            "expected_behavior": "Never repeat the email.",
        },
        headers=REVIEWER,
    )
    assert v1.status_code == 201
    assert v1.json()["version"] == 1 and v1.json()["reviewer"] == "rita" and v1.json()["is_current"]
    item = api.get(f"/v1/review/items/{cid}", headers=REVIEWER).json()
    assert item["state"] == "done" and item["claimed_by"] is None and item["review_count"] == 1
    assert cid not in {it["conversation_id"] for it in queue_of(api)["items"]}
    assert cid in {it["conversation_id"] for it in queue_of(api, status="done")["items"]}

    # a done item cannot be claimed: it would show as held in progress with nothing left to do
    for who in (REVIEWER, RAJ):
        r = api.post(f"/v1/review/items/{cid}/claim", headers=who)
        assert r.status_code == 409 and "done" in r.json()["detail"], r.text
    assert api.get(f"/v1/review/items/{cid}", headers=REVIEWER).json()["claimed_by"] is None
    assert all(p["holding"] == 0 for p in api.get("/v1/review/progress", headers=REVIEWER).json()["reviewers"])

    # the same label sent again (a retried request) adds no version
    same = {
        "label": "confirmed_failure",
        "category": "privacy_leak",
        "severity": "critical",
        "notes": "leaked the email",
        "expected_behavior": "Never repeat the email.",
    }
    again = api.post(url, json=same, headers=REVIEWER)
    assert again.status_code == 201 and again.json()["version"] == 1, again.text
    v2 = api.post(url, json={"label": "not_a_failure", "notes": "the user gave that email"}, headers=REVIEWER)
    assert v2.json()["version"] == 2
    hist = api.get(f"/v1/review/items/{cid}/history", headers=REVIEWER).json()
    assert [(lab["version"], lab["label"], lab["is_current"]) for lab in hist["labels"]] == [
        (1, "confirmed_failure", False),
        (2, "not_a_failure", True),
    ]
    assert [e["action"] for e in hist["audit"]] == ["enqueued", "claim", "label", "label"]
    assert all(e["actor"] == "rita" for e in hist["audit"][1:])
    current = api.get("/v1/review/labels", headers=REVIEWER).json()
    assert [(lab["conversation_id"], lab["label"]) for lab in current] == [(cid, "not_a_failure")]
    assert len(api.get("/v1/review/labels", params={"current_only": False}, headers=REVIEWER).json()) == 2
    # since is an instant: the same one written with any offset selects the same labels (the offset was
    # ignored, so +14:00 missed every label and -12:00 took older ones)
    second = datetime.fromisoformat(hist["labels"][1]["created_at"].replace("Z", "+00:00"))
    for offset in (0, 14, -12):
        at = second.astimezone(timezone(timedelta(hours=offset))).isoformat()
        got = api.get("/v1/review/labels", params={"current_only": False, "since": at}, headers=REVIEWER).json()
        assert [lab["version"] for lab in got] == [2], at
    assert (
        api.get("/v1/review/labels", params={"since": "0001-01-01T00:00:00+14:00"}, headers=REVIEWER).status_code == 422
    )


def test_a_misspelt_field_in_a_review_body_is_a_422_naming_it(api) -> None:
    """Unknown fields were dropped without a word: a label sent with "Notes" or "expected_behaviour" was
    saved with empty notes. Every review, judge and calibration request body now refuses them."""
    cid = _seed(api, 5)[0]["conversation_id"]
    r = api.post(
        f"/v1/review/items/{cid}/labels",
        json={"label": "unsure", "Notes": "kept?", "expected_behaviour": "y"},
        headers=REVIEWER,
    )
    assert r.status_code == 422, r.text
    assert {e["loc"][-1] for e in r.json()["detail"]} == {"Notes", "expected_behaviour"}
    assert api.get("/v1/review/labels", headers=REVIEWER).json() == []
    for path, body in (
        ("/v1/review/claim", {"agnet": "a"}),
        ("/v1/review/items", {"conversation_id": cid, "priority": 1}),
        ("/v1/review/bulk", {"conversation_ids": [cid], "action": "skip", "extra": 1}),
    ):
        r = api.post(path, json=body, headers=ADMIN)
        assert r.status_code == 422 and "extra" in r.text.lower(), (path, r.status_code, r.text[:300])


def test_labelling_an_unqueued_conversation_enqueues_it(api) -> None:
    convs = _seed(api, 30)
    queued = {it["conversation_id"] for it in queue_of(api, status="all")["items"]}
    clean = next(c["conversation_id"] for c in convs if c["conversation_id"] not in queued)
    r = api.post(f"/v1/review/items/{clean}/labels", json={"label": "not_a_failure"}, headers=RAJ)
    assert r.status_code == 201
    item = api.get(f"/v1/review/items/{clean}", headers=RAJ).json()
    assert item["state"] == "done" and item["reasons"][0]["kind"] == "manual"
    assert api.post("/v1/review/items/missing/labels", json={"label": "unsure"}, headers=RAJ).status_code == 404
    # enqueue by hand
    other = next(c["conversation_id"] for c in convs if c["conversation_id"] not in queued | {clean})
    added = api.post(
        "/v1/review/items", json={"conversation_id": other, "note": "customer complaint"}, headers=REVIEWER
    )
    assert added.status_code == 201 and added.json()["reasons"][0]["detail"] == "customer complaint"
    assert added.json()["priority"] == 50
    assert api.post("/v1/review/items", json={"conversation_id": "missing"}, headers=REVIEWER).status_code == 404


def test_two_reviewers_per_item_and_agreement(db_url, tmp_path) -> None:
    policy = tmp_path / "flagging.yaml"
    policy.write_text("multi_review: {share: 1.0, reviewers: 2}\ntaxonomy: {wrong_action: x, other: y}\n")
    rt = review_runtime(db_url, review_policy=str(policy))
    try:
        with review_client(rt) as api:
            _seed(api, 30)
            cid = api.post("/v1/review/claim", headers=REVIEWER).json()["conversation_id"]
            api.post(
                f"/v1/review/items/{cid}/labels",
                json={"label": "confirmed_failure", "category": "other"},
                headers=REVIEWER,
            )
            item = api.get(f"/v1/review/items/{cid}", headers=REVIEWER).json()
            assert item["state"] == "available" and item["review_count"] == 1 and item["required_reviews"] == 2
            # rita is not offered her own item again; raj is, first
            assert api.post("/v1/review/claim", headers=REVIEWER).json()["conversation_id"] != cid
            assert api.post("/v1/review/claim", headers=RAJ).json()["conversation_id"] == cid
            api.post(
                f"/v1/review/items/{cid}/labels",
                json={"label": "confirmed_failure", "category": "other"},
                headers=RAJ,
            )
            assert api.get(f"/v1/review/items/{cid}", headers=RAJ).json()["state"] == "done"
            prog = api.get("/v1/review/progress", headers=REVIEWER).json()
            assert prog["agreement"] == {
                "items": 1,
                "agreed": 1,
                "rate": 1.0,
                "labels_considered": 2,
                "bounded": False,
                "max_labels": 5000,
            }
            assert {p["reviewer"] for p in prog["reviewers"]} == {"rita", "raj"}
            rita = next(p for p in prog["reviewers"] if p["reviewer"] == "rita")
            assert rita["holding"] == 1 and rita["by_label"] == {"confirmed_failure": 1}
    finally:
        rt.close()


def test_double_review_is_blind_in_the_api(db_url, tmp_path) -> None:
    policy = tmp_path / "flagging.yaml"
    policy.write_text("multi_review: {share: 1.0, reviewers: 2}\ntaxonomy: {wrong_action: x, other: y}\n")
    rt = review_runtime(db_url, review_policy=str(policy))
    try:
        with review_client(rt) as api:
            _seed(api, 30)
            cid = api.post("/v1/review/claim", headers=REVIEWER).json()["conversation_id"]
            secret = {"label": "confirmed_failure", "category": "other", "notes": "rita's reasoning"}
            assert api.post(f"/v1/review/items/{cid}/labels", json=secret, headers=REVIEWER).status_code == 201

            def leaks(body: object) -> bool:
                return "rita's reasoning" in str(body) or "'reviewer': 'rita'" in str(body)

            # raj has not labelled: no way through the API to see rita's label
            item = api.get(f"/v1/review/items/{cid}", headers=RAJ).json()
            assert item["labels"] == [] and item["labels_hidden"] is True and item["review_count"] == 1
            hist = api.get(f"/v1/review/items/{cid}/history", headers=RAJ).json()
            assert not leaks(hist["labels"]) and not any(e["action"] == "label" for e in hist["audit"])
            assert not leaks(api.get("/v1/review/labels", headers=RAJ).json())
            assert not leaks(api.get("/v1/review/labels?current_only=false", headers=RAJ).json())
            queue_items = api.get("/v1/review/queue", params={"status": "all"}, headers=RAJ).json()["items"]
            assert not leaks([it["labels"] for it in queue_items])
            claimed = api.post("/v1/review/claim", headers=RAJ).json()
            assert claimed["conversation_id"] == cid and claimed["item"]["labels"] == []
            assert not leaks(api.get(f"/v1/conversations/{cid}", headers=RAJ).json()["review"])
            # rita sees her own label; admins see everything
            assert [
                lab["reviewer"] for lab in api.get(f"/v1/review/items/{cid}", headers=REVIEWER).json()["labels"]
            ] == ["rita"]
            assert leaks(api.get(f"/v1/review/items/{cid}", headers=ADMIN).json()["labels"])
            assert leaks(api.get(f"/v1/review/items/{cid}/history", headers=ADMIN).json())
            assert leaks(api.get("/v1/review/labels", headers=ADMIN).json())
            # once raj has labelled, the review is open to him
            api.post(f"/v1/review/items/{cid}/labels", json={"label": "not_a_failure"}, headers=RAJ)
            item = api.get(f"/v1/review/items/{cid}", headers=RAJ).json()
            assert {lab["reviewer"] for lab in item["labels"]} == {"rita", "raj"} and not item["labels_hidden"]
            assert leaks(api.get(f"/v1/review/items/{cid}/history", headers=RAJ).json())
            assert leaks(api.get("/v1/review/labels", headers=RAJ).json())
    finally:
        rt.close()


def test_failure_clusters_keep_double_review_blind(db_url, tmp_path) -> None:
    import re

    policy = tmp_path / "flagging.yaml"
    policy.write_text("multi_review: {share: 1.0, reviewers: 2}\ntaxonomy: {hallucination: x, other: y}\n")
    rt = review_runtime(db_url, review_policy=str(policy))
    try:
        with review_client(rt) as api:
            _seed(api, 30)
            cid = api.post("/v1/review/claim", headers=REVIEWER).json()["conversation_id"]
            secret = {"label": "confirmed_failure", "category": "hallucination"}
            assert api.post(f"/v1/review/items/{cid}/labels", json=secret, headers=REVIEWER).status_code == 201

            def listed(headers: dict[str, str]) -> bool:
                data = api.get("/v1/review/clusters", headers=headers).json()
                return data["total"] == 1 and any(cid in c["examples"] for c in data["clusters"])

            # raj has not labelled: the clusters would tell him rita's verdict and category
            assert api.get(f"/v1/review/items/{cid}", headers=RAJ).json()["labels_hidden"] is True
            assert api.get("/v1/review/clusters", headers=RAJ).json() == {"total": 0, "clusters": [], "by_category": []}
            assert listed(REVIEWER) and listed(ADMIN)  # rita's own label; admins' API calls see everything
            page = api.get("/ui/login").text
            token = re.search(r'name="csrf" value="([^"]+)"', page)
            assert token
            api.post("/ui/login", data={"csrf": token.group(1), "api_key": "raj-key", "next": "/ui/clusters"})
            html = api.get("/ui/clusters").text
            assert "No confirmed failures yet" in html and cid[:12] not in html
            # once raj has labelled, the review is open to him, and the clusters with it
            api.post(f"/v1/review/items/{cid}/labels", json=secret, headers=RAJ)
            assert listed(RAJ)
            assert cid[:12] in api.get("/ui/clusters").text
    finally:
        rt.close()


def test_clusters_group_confirmed_failures(api) -> None:
    convs = _seed(api, 80, seed=3)
    by_defect: dict[str, list[str]] = {}
    for c in convs:
        if c["metadata"]["simulated_defect"]:
            by_defect.setdefault(c["metadata"]["simulated_defect"], []).append(c["conversation_id"])
    cancels = by_defect["cancel_delivered"][:3]
    pii = by_defect["pii_leak"][:1]
    for cid in cancels:
        api.post(
            f"/v1/review/items/{cid}/labels",
            json={"label": "confirmed_failure", "category": "wrong_action"},
            headers=REVIEWER,
        )
    for cid in pii:
        api.post(
            f"/v1/review/items/{cid}/labels",
            json={"label": "confirmed_failure", "category": "privacy_leak"},
            headers=REVIEWER,
        )
    api.post(
        f"/v1/review/items/{by_defect['pii_leak'][1]}/labels",
        json={"label": "not_a_failure"},
        headers=REVIEWER,
    )
    data = api.get("/v1/review/clusters", headers=REVIEWER).json()
    assert data["total"] == 4
    top = data["clusters"][0]
    assert (top["category"], top["rule_id"], top["tool"], top["count"]) == (
        "wrong_action",
        "no-cancel-delivered-order",
        "cancel_pending_order",
        3,
    )
    assert top["summary"].startswith("3 of 4 failures: called cancel_pending_order")
    assert set(top["examples"]) == set(cancels)
    assert {"category": "privacy_leak", "count": 1} in data["by_category"]


def test_a_tie_between_two_reviewers_is_not_a_confirmed_failure(api) -> None:
    convs = _seed(api, 80, seed=3)
    cid = next(c["conversation_id"] for c in convs if c["metadata"]["simulated_defect"] == "cancel_delivered")
    url = f"/v1/review/items/{cid}/labels"
    confirmed = {"label": "confirmed_failure", "category": "wrong_action"}
    assert api.post(url, json=confirmed, headers=REVIEWER).status_code == 201
    assert api.get("/v1/review/clusters", headers=REVIEWER).json()["total"] == 1
    assert api.post(url, json={"label": "not_a_failure"}, headers=RAJ).status_code == 201
    data = api.get("/v1/review/clusters", headers=REVIEWER).json()
    assert data["total"] == 0 and data["clusters"] == [] and data["by_category"] == []


def test_clusters_count_each_conversation_once(api, rt) -> None:
    from vigil.store.models import FindingRow

    convs = _seed(api, 80, seed=3)
    cancels = [c for c in convs if c["metadata"]["simulated_defect"] == "cancel_delivered"][:3]
    for c in cancels:
        api.post(
            f"/v1/review/items/{c['conversation_id']}/labels",
            json={"label": "confirmed_failure", "category": "wrong_action"},
            headers=REVIEWER,
        )
    # a second, more severe rule fired on one of them, and a minor one on another
    extra = [(cancels[0], "extra-critical", "critical"), (cancels[1], "extra-low", "low")]
    with rt.sessions.begin() as s:
        for c, rule, severity in extra:
            s.add(
                FindingRow(
                    conversation_id=c["conversation_id"],
                    revision=1,
                    agent_id=c["agent_id"],
                    agent_version=c["agent_version"],
                    rule_id=rule,
                    rule_type="regex",
                    severity=severity,
                    message=f"{rule} fired",
                    evidence=[],
                    details={},
                )
            )
    data = api.get("/v1/review/clusters", headers=REVIEWER).json()
    assert data["total"] == 3
    assert sum(c["count"] for c in data["clusters"]) == 3
    assert sum(c["share"] for c in data["clusters"]) == pytest.approx(1.0)
    by_rule = {c["rule_id"]: c for c in data["clusters"]}
    assert set(by_rule) == {"extra-critical", "no-cancel-delivered-order"}
    assert by_rule["extra-critical"]["examples"] == [cancels[0]["conversation_id"]]
    assert by_rule["extra-critical"]["also"] == [{"rule_id": "no-cancel-delivered-order", "count": 1}]
    cancel = by_rule["no-cancel-delivered-order"]
    assert cancel["count"] == 2 and cancel["summary"].startswith("2 of 3 failures")
    assert {"rule_id": "extra-low", "count": 1} in cancel["also"]


def test_roles_audit_and_openapi(api) -> None:
    _seed(api, 20)
    assert api.get("/v1/review/queue", headers=INGEST).status_code == 403
    assert api.get("/v1/review/queue").status_code == 401
    assert api.post("/v1/review/claim", headers=INGEST).status_code == 403
    cid = api.post("/v1/review/claim", headers=ADMIN).json()["conversation_id"]
    assert api.get("/v1/review/audit", headers=REVIEWER).status_code == 403
    log = api.get("/v1/review/audit", params={"actor": "admin"}, headers=ADMIN).json()
    assert [(e["action"], e["conversation_id"]) for e in log] == [("claim", cid)]
    tax = api.get("/v1/review/taxonomy", headers=REVIEWER).json()
    assert tax["labels"] == ["confirmed_failure", "not_a_failure", "unsure"] and "wrong_action" in tax["categories"]
    paths = api.get("/openapi.json").json()["paths"]
    for p in (
        "/v1/review/queue",
        "/v1/review/claim",
        "/v1/review/items/{conversation_id}/extend",
        "/v1/review/items/{conversation_id}/release",
        "/v1/review/items/{conversation_id}/skip",
        "/v1/review/items/{conversation_id}/labels",
        "/v1/review/items/{conversation_id}/history",
        "/v1/review/clusters",
        "/v1/review/labels",
        "/v1/review/progress",
    ):
        assert p in paths, p
    assert not any(p.startswith("/ui") for p in paths)
    enriched = api.get(f"/v1/conversations/{cid}", headers=REVIEWER).json()
    assert enriched["review"]["claimed_by"] == "admin"


def test_metrics(api) -> None:
    _seed(api, 30)
    api.post("/v1/review/claim", headers=REVIEWER)
    text = api.get("/metrics").text
    assert 'vigil_review_enqueued_total{reason="finding"}' in text
    assert 'vigil_review_claims_total{result="claimed"} 1.0' in text
    open_items = queue_of(api)["counts"]["open"]
    assert f"vigil_review_queue_open_items {float(open_items)}" in text


@pytest.mark.parametrize(
    ("field", "value", "known"),
    [("severity", "hihg", "critical"), ("reason", "findings", "judge_fail")],
)
def test_a_filter_value_no_item_can_have_is_a_422_not_an_empty_queue(api, field: str, value: str, known: str) -> None:
    """A mistyped severity or reason answered an empty queue (and claim-next 204, nothing left to claim), so a
    reviewer could not tell a typo from a queue with nothing to review; the answer names the known values."""
    _seed(api)
    r = api.get("/v1/review/queue", params={field: value}, headers=REVIEWER)
    assert r.status_code == 422, r.text
    assert value in r.text and known in r.text
    r = api.post("/v1/review/claim", json={field: value}, headers=REVIEWER)
    assert r.status_code == 422, r.text
    assert value in r.text and known in r.text
    # a known value matches regardless of case, as before
    assert api.get("/v1/review/queue", params={field: known.upper()}, headers=REVIEWER).status_code == 200
