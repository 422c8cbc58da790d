"""Triage at the pace of traffic, through the API: search, sort, filters from known values, snippets and times."""

from __future__ import annotations

from urllib.parse import quote

from tests.support.app import ADMIN, INGEST, REVIEWER
from tests.support.review import queue_of, review_runtime, simulated


def _seed(api, n: int = 40, seed: int = 7) -> list[dict]:  # type: ignore[no-untyped-def]
    convs = simulated(n, "v1.4.0:0.2,v1.5.0:0.7", seed=seed)
    assert api.post("/v1/conversations", json=convs, headers=INGEST).status_code == 202
    return convs


def _ids(data: dict) -> list[str]:
    return [it["conversation_id"] for it in data["items"]]


def test_filters_match_regardless_of_case(api) -> None:
    _seed(api)
    everything = queue_of(api)
    assert everything["total"] > 3
    assert _ids(queue_of(api, agent="Support-Bot")) == _ids(everything)
    v15 = queue_of(api, version="V1.5.0")
    assert v15["items"] and all(it["agent_version"] == "v1.5.0" for it in v15["items"])
    rule = next(r["key"] for it in everything["items"] for r in it["reasons"] if r["kind"] == "finding")
    by_rule = queue_of(api, rule=rule.upper())
    assert by_rule["items"] and _ids(by_rule) == _ids(queue_of(api, rule=rule))
    sev = next(it["max_severity"] for it in everything["items"] if it["max_severity"])
    by_sev = queue_of(api, severity=sev.upper())
    assert by_sev["items"] and {it["max_severity"] for it in by_sev["items"]} == {sev}
    assert queue_of(api, agent="nobody")["items"] == []


def test_filter_menus_list_known_values(api) -> None:
    convs = _seed(api)
    r = api.get("/v1/review/queue/filters", headers=REVIEWER)
    assert r.status_code == 200, r.text
    known = r.json()
    assert known["agent"] == ["support-bot"]
    assert set(known["version"]) == {c["agent_version"] for c in convs} & set(known["version"])
    assert "v1.5.0" in known["version"]
    assert "pii-in-reply" in known["rule"]  # a loaded rule, whether or not it flagged anything yet
    assert known["severity"][0] == "critical" and "open" in known["status"] and "received" in known["sort"]


def test_search_by_id_task_user_and_text(api) -> None:
    convs = _seed(api)
    items = queue_of(api)["items"]
    by_id = {c["conversation_id"]: c for c in convs}
    target = by_id[items[0]["conversation_id"]]
    cid = target["conversation_id"]
    assert cid in _ids(queue_of(api, q=cid[-6:].upper()))
    if target.get("task_id"):
        assert cid in _ids(queue_of(api, q=target["task_id"]))
    user_text = next(m["content"] for m in target["messages"] if m["role"] == "user")
    words = " ".join(user_text.split()[:3])
    found = queue_of(api, q=words.upper())
    assert cid in _ids(found)
    assert all(
        words.lower() in str(by_id[i]).lower() or words.lower() in i.lower() for i in _ids(found)
    )  # every hit holds the words
    assert queue_of(api, q="no such text anywhere 1f0e")["items"] == []
    # LIKE wildcards are searched for literally
    assert queue_of(api, q="%")["items"] == [] or all("%" in str(by_id[i]) for i in _ids(queue_of(api, q="%")))
    assert queue_of(api, q="_")["items"] == [] or all("_" in str(by_id[i]) for i in _ids(queue_of(api, q="_")))


def test_search_finds_quotes_backslashes_and_line_breaks_as_typed(api) -> None:
    convs = _seed(api)
    items = queue_of(api)["items"]
    target = next(c for c in convs if c["conversation_id"] == items[0]["conversation_id"])
    user = next(m for m in target["messages"] if m["role"] == "user")
    user["content"] = 'My code is "AB-77\\x"\n\tand it failed.'
    target["revision"] = target.get("revision", 0) + 1
    assert api.post("/v1/conversations", json=[target], headers=INGEST).status_code == 202
    cid = target["conversation_id"]
    # stored as JSON, the quote, the backslash and the line break are escaped; search takes them as typed
    assert _ids(queue_of(api, q='"AB-77\\x"')) == [cid]
    assert _ids(queue_of(api, q='x"\n\tand it')) == [cid]
    assert queue_of(api, q='\\"AB-77')["items"] == []  # the escape itself is not text of the conversation


def test_search_finds_text_beyond_ascii_whichever_way_the_client_encoded_it(api) -> None:
    """Python's json writes ASCII only by default: 'Müller' arrives (and is stored) as 'M\\u00fcller', so a
    search for what the reviewer reads on the page found nothing."""
    import json

    convs = _seed(api)
    items = queue_of(api)["items"]
    escaped, raw = (next(c for c in convs if c["conversation_id"] == it["conversation_id"]) for it in items[:2])
    for conv, text in ((escaped, "Kundin Grüße an Frau Müller"), (raw, "Ticket für Zoë")):
        next(m for m in conv["messages"] if m["role"] == "user")["content"] = text
        conv["revision"] = conv.get("revision", 0) + 1
    headers = {**INGEST, "Content-Type": "application/json"}
    # one object, as an agent posts each conversation (stored as sent; an array's items are written anew)
    assert api.post("/v1/conversations", content=json.dumps(escaped), headers=headers).status_code == 202
    body = json.dumps([raw], ensure_ascii=False).encode()
    assert api.post("/v1/conversations", content=body, headers=headers).status_code == 202
    assert _ids(queue_of(api, q="Frau Müller")) == [escaped["conversation_id"]]
    assert _ids(queue_of(api, q="für Zoë")) == [raw["conversation_id"]]


def test_sort_by_columns_and_snippets_and_times(api) -> None:
    convs = _seed(api)
    by_id = {c["conversation_id"]: c for c in convs}
    data = queue_of(api, sort="received", order="asc")
    assert data["sort"] == "received" and data["descending"] is False
    received = [it["received_at"] for it in data["items"]]
    assert received == sorted(received) and all(received)
    newest_first = queue_of(api, sort="flagged")
    assert newest_first["descending"] is True
    flagged = [it["flagged_at"] for it in newest_first["items"]]
    assert flagged == sorted(flagged, reverse=True)
    msgs = [it["message_count"] for it in queue_of(api, sort="messages", order="desc")["items"]]
    assert msgs == sorted(msgs, reverse=True)
    for it in data["items"]:
        first_user = next(m["content"] for m in by_id[it["conversation_id"]]["messages"] if m["role"] == "user")
        assert it["snippet"] and " ".join(first_user.split()).startswith(it["snippet"].rstrip("…"))
    r = api.get("/v1/review/queue", params={"sort": "nonsense"}, headers=REVIEWER)
    assert r.status_code == 422 and "sort must be one of" in r.text


def test_claim_next_takes_search_and_case_insensitive_filters(api) -> None:
    _seed(api)
    target = queue_of(api, version="v1.5.0")["items"][-1]["conversation_id"]
    r = api.post("/v1/review/claim", json={"q": target, "agent": "SUPPORT-BOT"}, headers=REVIEWER)
    assert r.status_code == 200, r.text
    assert r.json()["conversation_id"] == target


def test_cli_queue_searches_filters_and_sorts(sqlite_url, monkeypatch) -> None:
    import orjson
    from typer.testing import CliRunner

    from tests.support.review import store
    from vigil.app.cli import app

    rt = review_runtime(sqlite_url)
    convs = simulated(30, "v1.4.0:0.2,v1.5.0:0.7", seed=5)
    store(rt, convs)
    rt.close()
    monkeypatch.setenv("VIGIL_DATABASE_URL", sqlite_url)
    runner = CliRunner()
    r = runner.invoke(app, ["review", "queue", "--json", "--limit", "100", "--sort", "received", "--asc"])
    assert r.exit_code == 0, r.output
    data = orjson.loads(r.stdout)
    assert data["sort"] == "received" and not data["descending"]
    target = data["items"][0]["conversation_id"]
    r = runner.invoke(app, ["review", "queue", "--json", "--search", target.upper(), "--agent", "SUPPORT-BOT"])
    assert r.exit_code == 0 and [it["conversation_id"] for it in orjson.loads(r.stdout)["items"]] == [target]
    r = runner.invoke(app, ["review", "queue", "--sort", "bogus"])
    assert r.exit_code == 2 and "--sort must be one of" in r.output


NAMES = ["Yuki Moreau", "Mia Khan", "Sofia Brown", "Lena Novak", "Liam Lopez", "Chen Smith", "Noah Ito"]
ITEMS = ["yoga mat", "espresso maker", "water bottle", "hiking boots", "mechanical keyboard"]


def near_duplicates(n: int = 20, prefix: str = "dup") -> list[dict]:
    """``n`` conversations that differ only in the order number, the item and the customer."""
    out = []
    for i in range(n):
        name = NAMES[i % len(NAMES)]
        email = name.lower().replace(" ", ".") + "@example.com"
        out.append(
            {
                "conversation_id": f"{prefix}-{i:03d}",
                "agent_id": "support-bot",
                "agent_version": "v1.5.0",
                "task_id": f"cancel-order-{i}",
                "messages": [
                    {"role": "system", "content": "You are a support agent for an online shop."},
                    {
                        "role": "user",
                        "content": f"Hi, I want to cancel my order #W{7000000 + i * 7919}, "
                        f"the {ITEMS[i % len(ITEMS)]}. My name is {name}.",
                    },
                    {"role": "assistant", "content": f"Done! I cancelled it and sent the receipt to {email}."},
                ],
            }
        )
    return out


def test_a_cluster_of_20_near_duplicates_is_labelled_in_one_action(api, rt) -> None:
    from sqlalchemy import select

    from vigil.review.models import ReviewAuditRow
    from vigil.store.models import ReviewLabelRow

    dups = near_duplicates(20)
    # other traffic, flagged for other reasons (simulated PII leaks would be near-duplicates of these)
    others = [c for c in simulated(30, "v1.4.0:0.6", seed=9) if c["metadata"]["simulated_defect"] != "pii_leak"]
    assert api.post("/v1/conversations", json=dups + others, headers=INGEST).status_code == 202
    r = api.get("/v1/review/queue/clusters", headers=REVIEWER)
    assert r.status_code == 200, r.text
    dup_ids = {c["conversation_id"] for c in dups}
    [cluster] = [c for c in r.json()["clusters"] if dup_ids & {m["conversation_id"] for m in c["members"]}]
    members = [m["conversation_id"] for m in cluster["members"]]
    assert set(members) == dup_ids and cluster["size"] == 20  # the near-duplicates, and nothing else
    assert cluster["reason"]["kind"] == "finding" and cluster["sample"][0] == members[0]
    assert api.get(f"/v1/review/queue/clusters/{cluster['id']}", headers=REVIEWER).json()["size"] == 20

    # raj holds one member: it is left to him
    held = members[5]
    assert api.post(f"/v1/review/items/{held}/claim", headers={"Authorization": "Bearer raj-key"}).status_code == 200
    body = {
        "sample": members[0],
        "members": members,
        "label": "confirmed_failure",
        "category": "privacy_leak",
        "severity": "high",
        "notes": "emails the receipt to the address on file in the reply",
    }
    r = api.post("/v1/review/queue/clusters/label", json=body, headers=REVIEWER)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["labelled"][0] == members[0] and len(out["labelled"]) == 19
    assert out["skipped"] == [{"conversation_id": held, "why": "raj holds it"}]

    with rt.sessions() as s:
        rows = {r.conversation_id: r for r in s.scalars(select(ReviewLabelRow).where(ReviewLabelRow.is_current))}
        audit = s.scalars(select(ReviewAuditRow).where(ReviewAuditRow.action == "label")).all()
    assert rows[members[0]].propagated_from is None and rows[members[0]].reviewer == "rita"
    for cid in out["labelled"][1:]:
        row = rows[cid]
        assert (row.reviewer, row.label, row.category, row.propagated_from) == (
            "rita",
            "confirmed_failure",
            "privacy_leak",
            members[0],
        )
    assert held not in rows
    propagated = [a for a in audit if a.detail.get("propagated_from") == members[0]]
    assert len(propagated) == 18 and all(a.actor == "rita" for a in propagated)
    history = api.get(f"/v1/review/items/{members[1]}/history", headers=REVIEWER).json()
    assert history["labels"][-1]["propagated_from"] == members[0]
    # labelled items leave the open queue; the cluster is gone from the list
    left = api.get("/v1/review/queue/clusters", headers=REVIEWER).json()["clusters"]
    assert not any((dup_ids - {held}) & {m["conversation_id"] for m in c["members"]} for c in left)
    assert api.get(f"/v1/review/queue/clusters/{cluster['id']}", headers=REVIEWER).status_code == 404


def test_cluster_label_is_checked_like_any_label(api) -> None:
    dups = near_duplicates(4, "chk")
    assert api.post("/v1/conversations", json=dups, headers=INGEST).status_code == 202
    ids = [c["conversation_id"] for c in dups]
    body = {"sample": ids[0], "members": ids, "label": "confirmed_failure"}
    r = api.post("/v1/review/queue/clusters/label", json=body, headers=REVIEWER)
    assert r.status_code == 422 and "needs a category" in r.text
    r = api.post("/v1/review/queue/clusters/label", json={**body, "sample": "nope"}, headers=REVIEWER)
    assert r.status_code == 422 or r.status_code == 404
    assert api.get("/v1/review/labels", headers=REVIEWER).json() == []


def test_a_cluster_label_reaches_only_the_samples_near_duplicates(api) -> None:
    """The members list is the client's word: any queued conversation listed there got the sample's label
    (with propagated_from), so one call could label up to 500 unrelated items as read. Members that are not
    in the sample's open cluster are now left alone and reported."""
    dups = near_duplicates(4, "kin")
    stranger = near_duplicates(1, "far")[0]
    stranger["messages"][1]["content"] = "Which of your stores opens earliest on Sunday mornings during winter?"
    stranger["messages"][2]["content"] = "The Leeds store opens at eight; write to leeds.store@example.com."
    assert api.post("/v1/conversations", json=[*dups, stranger], headers=INGEST).status_code == 202
    queued = {it["conversation_id"] for it in queue_of(api, status="all")["items"]}
    assert stranger["conversation_id"] in queued  # flagged like the others, but not like them
    ids = [c["conversation_id"] for c in dups]
    body = {"sample": ids[0], "members": [*ids, stranger["conversation_id"]], "label": "not_a_failure"}
    out = api.post("/v1/review/queue/clusters/label", json=body, headers=REVIEWER).json()
    assert out["labelled"] == ids
    assert out["skipped"] == [
        {
            "conversation_id": stranger["conversation_id"],
            "why": "not a near-duplicate of the sample among the open items",
        }
    ]
    labelled = {lab["conversation_id"] for lab in api.get("/v1/review/labels", headers=REVIEWER).json()}
    assert labelled == set(ids)


RAJ = {"Authorization": "Bearer raj-key"}


def test_bulk_skip_and_assign(api) -> None:
    _seed(api)
    ids = _ids(queue_of(api))[:6]
    assert len(ids) == 6
    # raj holds the first: rita's bulk skip leaves it and skips the rest
    assert api.post(f"/v1/review/items/{ids[0]}/claim", headers=RAJ).status_code == 200
    r = api.post("/v1/review/bulk", json={"action": "skip", "conversation_ids": ids[:3] + ["nope"]}, headers=REVIEWER)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["done"] == ids[1:3]
    assert out["skipped"] == [
        {"conversation_id": ids[0], "why": "raj holds it"},
        {"conversation_id": "nope", "why": "not in the review queue"},
    ]
    # skipped items are not offered to rita again
    claimed = api.post("/v1/review/claim", headers=REVIEWER).json()["conversation_id"]
    assert claimed not in ids[:3]
    api.post(f"/v1/review/items/{claimed}/release", headers=REVIEWER)

    # assign the last three to raj: his claim-next offers them first, rita's never
    r = api.post(
        "/v1/review/bulk", json={"action": "assign", "conversation_ids": ids[3:], "assignee": "raj"}, headers=REVIEWER
    )
    assert r.status_code == 200 and r.json()["done"] == ids[3:]
    assert {it["assignee"] for it in queue_of(api)["items"] if it["conversation_id"] in ids[3:]} == {"raj"}
    api.post(f"/v1/review/items/{ids[0]}/release", headers=RAJ)
    got = set()
    for _ in range(3):
        cid = api.post("/v1/review/claim", headers=RAJ).json()["conversation_id"]
        got.add(cid)
        api.post(f"/v1/review/items/{cid}/skip", headers=RAJ)
    assert got == set(ids[3:])
    rita_claims = set()
    while (r := api.post("/v1/review/claim", json={"release_others": False}, headers=REVIEWER)).status_code == 200:
        rita_claims.add(r.json()["conversation_id"])
    assert rita_claims and not rita_claims & set(ids[3:])
    bad = api.post(
        "/v1/review/bulk", json={"action": "assign", "conversation_ids": ids, "assignee": "mallory"}, headers=REVIEWER
    )
    assert bad.status_code == 422 and "not a reviewer" in bad.text
    nobody = api.post("/v1/review/bulk", json={"action": "assign", "conversation_ids": ids}, headers=REVIEWER)
    assert nobody.status_code == 422 and nobody.json()["detail"] == "assign needs an assignee: one of admin, raj, rita"
    assert api.get("/v1/review/reviewers", headers=REVIEWER).json() == ["admin", "raj", "rita"]
    r = api.post("/v1/review/bulk", json={"action": "unassign", "conversation_ids": ids[3:]}, headers=REVIEWER)
    assert r.json()["done"] == ids[3:]
    assert all(it["assignee"] is None for it in queue_of(api, status="all")["items"])


def test_bulk_assign_and_unassign_leave_an_item_another_reviewer_holds(api) -> None:
    _seed(api)
    ids = _ids(queue_of(api))[:3]
    assert api.post(f"/v1/review/items/{ids[0]}/claim", headers=RAJ).status_code == 200
    held = [{"conversation_id": ids[0], "why": "raj holds it"}]
    body = {"action": "assign", "conversation_ids": ids, "assignee": "rita"}
    out = api.post("/v1/review/bulk", json=body, headers=REVIEWER).json()
    assert out["done"] == ids[1:] and out["skipped"] == held
    item = api.get(f"/v1/review/items/{ids[0]}", headers=ADMIN).json()
    assert item["assignee"] is None and item["claimed_by"] == "raj"
    # raj may still assign his own item; then rita cannot unassign it while he holds it
    mine = {"action": "assign", "conversation_ids": [ids[0]], "assignee": "raj"}
    assert api.post("/v1/review/bulk", json=mine, headers=RAJ).json()["done"] == [ids[0]]
    out = api.post("/v1/review/bulk", json={"action": "unassign", "conversation_ids": ids}, headers=REVIEWER).json()
    assert out["done"] == ids[1:] and out["skipped"] == held
    assert api.get(f"/v1/review/items/{ids[0]}", headers=ADMIN).json()["assignee"] == "raj"
    audit = api.get("/v1/review/audit", params={"conversation_id": ids[0]}, headers=ADMIN).json()
    assert [e["actor"] for e in audit if e["action"] in ("assign", "unassign")] == ["raj"]


def test_cli_bulk_assign_refuses_a_name_that_is_no_reviewer(sqlite_url, monkeypatch) -> None:
    from typer.testing import CliRunner

    from tests.support.app import API_KEYS
    from tests.support.review import store
    from vigil.app.cli import app

    rt = review_runtime(sqlite_url)
    store(rt, near_duplicates(2, "cli"))
    rt.close()
    monkeypatch.setenv("VIGIL_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("VIGIL_API_KEYS", API_KEYS)
    runner = CliRunner()
    r = runner.invoke(app, ["review", "bulk", "assign", "cli-001", "--as", "rita", "--to", "mallory"])
    # the API's answer, word for word: an item assigned to nobody who can log in would wait for nobody
    assert r.exit_code == 2, r.output
    assert "'mallory' is not a reviewer; one of admin, raj, rita" in r.output
    r = runner.invoke(app, ["review", "queue", "--json"])
    assert r.exit_code == 0 and "mallory" not in r.output
    r = runner.invoke(app, ["review", "bulk", "assign", "cli-001", "--as", "rita", "--to", "raj"])
    assert r.exit_code == 0 and "1 done" in r.output


def test_an_id_ending_in_a_sub_resource_name_reaches_its_item(api) -> None:
    """GET /v1/review/items/h%2Fhistory answered the history of "h", and k%2Fcomments the comments of "k":
    routing decodes the slash before matching, so the item itself could not be fetched at all."""
    base = {"agent_id": "a", "agent_version": "v1"}
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    ids = ["h", "h/history", "k", "k/comments"]
    docs = [{**base, "conversation_id": cid, "messages": msgs} for cid in ids]
    assert api.post("/v1/conversations", json=docs, headers=INGEST).status_code == 202
    for cid in ids:
        r = api.post("/v1/review/items", json={"conversation_id": cid}, headers=ADMIN)
        assert r.status_code == 201, r.text
    for cid in ids:
        got = api.get(f"/v1/review/items/{quote(cid, safe='')}", headers=REVIEWER)
        assert got.status_code == 200 and got.json()["conversation_id"] == cid, (cid, got.text[:200])
    assert api.get("/v1/review/items/h/history", headers=REVIEWER).json()["conversation_id"] == "h"
    hist = api.get("/v1/review/items/h%2Fhistory/history", headers=REVIEWER).json()
    assert hist["conversation_id"] == "h/history"
    assert api.get("/v1/review/items/k/comments", headers=REVIEWER).json() == []


def test_comments_on_conversations_and_messages(api) -> None:
    convs = _seed(api, 10)
    cid = convs[0]["conversation_id"]
    hostile = '<script>window.__xss=1</script> & "quotes"'
    r = api.post(f"/v1/review/items/{cid}/comments", json={"body": hostile}, headers=REVIEWER)
    assert r.status_code == 201, r.text
    r = api.post(f"/v1/review/items/{cid}/comments", json={"body": "this turn", "message_index": 1}, headers=RAJ)
    assert r.status_code == 201
    # (an admin reads every comment: this item may be a blind double review, where rita would not see raj's)
    listed = api.get(f"/v1/review/items/{cid}/comments", headers=ADMIN).json()
    assert [(c["author"], c["body"], c["message_index"]) for c in listed] == [
        ("rita", hostile, None),
        ("raj", "this turn", 1),
    ]
    n = len(convs[0]["messages"])
    r = api.post(f"/v1/review/items/{cid}/comments", json={"body": "x", "message_index": n}, headers=REVIEWER)
    assert r.status_code == 422 and "not in this conversation" in r.text
    r = api.post(f"/v1/review/items/{cid}/comments", json={"body": "   "}, headers=REVIEWER)
    assert r.status_code == 422
    r = api.post("/v1/review/items/nope/comments", json={"body": "x"}, headers=REVIEWER)
    assert r.status_code == 404
    # a message index is a JSON integer (true and "1" were stored as 1); a misspelt field is a 422, not dropped
    for odd in ({"body": "x", "message_index": True}, {"body": "x", "message_index": "1"}, {"body": "x", "msg": 1}):
        r = api.post(f"/v1/review/items/{cid}/comments", json=odd, headers=REVIEWER)
        assert r.status_code == 422, (odd, r.text)
    audit = api.get(f"/v1/review/items/{cid}/history", headers=REVIEWER).json()["audit"]
    assert [e["actor"] for e in audit if e["action"] == "comment"] == ["rita", "raj"]


def _shared_task(convs: list[dict]) -> str:
    by_task: dict[str, set[str]] = {}
    for c in convs:
        by_task.setdefault(c["task_id"], set()).add(c["agent_version"])
    return next(t for t, versions in sorted(by_task.items()) if len(versions) > 1)


def test_side_by_side_and_pairwise_choices(api) -> None:
    convs = _seed(api, 60)
    task = _shared_task(convs)
    r = api.get("/v1/review/side-by-side", params={"task": task, "a": "v1.5.0", "b": "v1.4.0"}, headers=REVIEWER)
    assert r.status_code == 200, r.text
    pair = r.json()
    runs = {c["conversation_id"]: c for c in convs if c["task_id"] == task}
    assert runs[pair["a"]["conversation_id"]]["agent_version"] == "v1.5.0"
    assert runs[pair["b"]["conversation_id"]]["agent_version"] == "v1.4.0"
    assert set(pair["versions"]) == {"v1.5.0", "v1.4.0"}
    # from a conversation: its version on the left, the other version on the right by default
    cid = pair["b"]["conversation_id"]
    r = api.get("/v1/review/side-by-side", params={"task": task, "ca": cid}, headers=REVIEWER)
    assert r.json()["a"]["conversation_id"] == cid and r.json()["b"]["version"] == "v1.5.0"
    # refused: one version with itself, a run of another task, an unknown task
    r = api.get("/v1/review/side-by-side", params={"task": task, "a": "v1.5.0", "b": "v1.5.0"}, headers=REVIEWER)
    assert r.status_code == 422 and "two different versions" in r.text
    other = next(c["conversation_id"] for c in convs if c["task_id"] != task)
    r = api.get("/v1/review/side-by-side", params={"task": task, "ca": other}, headers=REVIEWER)
    assert r.status_code == 422 and "is not a run of task" in r.text
    assert api.get("/v1/review/side-by-side", params={"task": "nope"}, headers=REVIEWER).status_code == 404

    body = {
        "conversation_a": pair["a"]["conversation_id"],
        "conversation_b": cid,
        "choice": "b",
        "notes": "asked first",
    }
    r = api.post("/v1/review/pairwise", json=body, headers=REVIEWER)
    assert r.status_code == 201, r.text
    assert r.json()["human"] == "b" and r.json()["version_a"] == "v1.5.0" and r.json()["task_id"] == task
    bad = api.post("/v1/review/pairwise", json={**body, "conversation_b": other}, headers=REVIEWER)
    assert bad.status_code == 422 and "same task" in bad.text
    assert api.post("/v1/review/pairwise", json={**body, "choice": "c"}, headers=REVIEWER).status_code == 422
    listed = api.get("/v1/review/pairwise", params={"task": task}, headers=REVIEWER).json()
    assert [(c["reviewer"], c["human"], c["notes"]) for c in listed] == [("rita", "b", "asked first")]


def test_cli_bulk_clusters_comments_and_pairwise(sqlite_url, tmp_path, monkeypatch) -> None:
    import orjson
    from typer.testing import CliRunner

    from tests.support.review import store
    from vigil.app.cli import app

    rt = review_runtime(sqlite_url)
    store(rt, near_duplicates(6, "cli"))
    rt.close()
    monkeypatch.setenv("VIGIL_DATABASE_URL", sqlite_url)
    runner = CliRunner()
    r = runner.invoke(app, ["review", "near-duplicates", "--json"])
    assert r.exit_code == 0, r.output
    [cluster] = orjson.loads(r.stdout)["clusters"]
    assert cluster["size"] == 6
    r = runner.invoke(app, ["review", "bulk", "assign", "cli-005", "--as", "rita", "--to", "raj"])
    assert r.exit_code == 0 and "1 done" in r.output
    r = runner.invoke(app, ["review", "bulk", "skip", "cli-004", "nope", "--as", "rita"])
    assert r.exit_code == 0 and "nope: not in the review queue" in r.output
    r = runner.invoke(app, ["review", "label-cluster", cluster["id"], "--as", "raj", "--label", "confirmed_failure"])
    assert r.exit_code == 2 and "needs a category" in r.output
    r = runner.invoke(
        app,
        [
            "review",
            "label-cluster",
            cluster["id"],
            "--as",
            "raj",
            "--label",
            "confirmed_failure",
            "--category",
            "privacy_leak",
        ],
    )
    assert r.exit_code == 0 and "labelled 6 (5 from" in r.output, r.output
    r = runner.invoke(app, ["review", "comment", "cli-001", "see turn 2", "--as", "raj", "--message", "2"])
    assert r.exit_code == 0
    r = runner.invoke(app, ["review", "comment", "cli-001", "x", "--as", "raj", "--message", "99"])
    assert r.exit_code == 2 and "not in this conversation" in r.output
    labels = tmp_path / "labels.jsonl"
    assert runner.invoke(app, ["review", "labels", "--out", str(labels)]).exit_code == 0
    rows = [orjson.loads(line) for line in labels.read_bytes().splitlines()]
    assert len(rows) == 6 and sum(1 for row in rows if row["propagated_from"]) == 5
    r = runner.invoke(app, ["review", "pairwise"])
    assert r.exit_code == 0 and "0 choices" in r.output


def test_a_refused_label_is_an_error_on_its_field_and_the_form_explains_itself(api) -> None:
    import re

    convs = _seed(api, 10)
    cid = convs[0]["conversation_id"]
    login = api.get("/ui/login")
    token = re.search(r'name="csrf" value="([^"]+)"', login.text).group(1)  # type: ignore[union-attr]
    api.post("/ui/login", data={"csrf": token, "api_key": "rita-key", "next": "/ui/queue"})
    page = api.get(f"/ui/review/{cid}")
    token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    # the rubric and the categories' descriptions are in the form
    assert "The flag was wrong: the agent did what it should have done." in page.text
    assert 'data-description="Disclosed personal or payment data"' in page.text
    assert "0 labelled this session" in page.text
    r = api.post(f"/ui/review/{cid}/label", data={"csrf": token, "label": "confirmed_failure", "notes": "kept"})
    assert r.status_code == 422
    assert (
        '<p class="error" id="label-error" role="alert">Label not saved: a confirmed failure needs a category' in r.text
    )
    assert (
        'id="category" name="category" aria-describedby="category-help category-error" autofocus aria-invalid="true"'
        in r.text
    )
    assert 'id="category-error" class="error small" role="alert">' in r.text  # shown, not hidden
    assert ">kept</textarea>" in r.text
    ok = api.post(
        f"/ui/review/{cid}/label",
        data={"csrf": token, "label": "confirmed_failure", "category": "tone"},
        follow_redirects=False,
    )
    assert ok.status_code == 303 and ok.headers["location"].endswith("notice=labelled")
    after = api.get(ok.headers["location"])
    assert 'class="toast" id="toast" role="status">Saved<' in after.text and "1 labelled this session" in after.text


def test_cluster_labels_count_toward_each_items_reviews(api, rt) -> None:
    from sqlalchemy import select

    from vigil.store.models import ReviewItemRow

    dups = near_duplicates(40, "cnt")
    assert api.post("/v1/conversations", json=dups, headers=INGEST).status_code == 202
    [cluster] = api.get("/v1/review/queue/clusters", headers=REVIEWER).json()["clusters"]
    members = [m["conversation_id"] for m in cluster["members"]]
    assert len(members) == 40
    # rita held one member: the cluster label releases her claim on it
    assert api.post(f"/v1/review/items/{members[3]}/claim", headers=REVIEWER).status_code == 200
    body = {"sample": members[0], "members": members, "label": "not_a_failure"}
    assert len(api.post("/v1/review/queue/clusters/label", json=body, headers=REVIEWER).json()["labelled"]) == 40
    with rt.sessions() as s:
        items = {i.conversation_id: i for i in s.scalars(select(ReviewItemRow))}
    double = {cid for cid, i in items.items() if i.required_reviews > 1}
    assert double, "the policy puts a share of items up for double review"
    for cid, item in items.items():
        assert item.review_count == 1 and item.claimed_by is None
        assert item.status == ("open" if cid in double else "done")
    # the double-review members are left for raj; his cluster label completes them
    [for_raj] = api.get("/v1/review/queue/clusters", headers=RAJ).json()["clusters"]
    assert {m["conversation_id"] for m in for_raj["members"]} == double
    raj_body = {"sample": for_raj["sample"][0], "members": list(double), "label": "not_a_failure"}
    out = api.post("/v1/review/queue/clusters/label", json=raj_body, headers=RAJ).json()
    assert set(out["labelled"]) == double and out["skipped"] == []
    with rt.sessions() as s:
        assert {i.status for i in s.scalars(select(ReviewItemRow))} == {"done"}
    again = api.post("/v1/review/queue/clusters/label", json=body, headers=REVIEWER).json()
    assert again["skipped"] and all(x["why"] == "already done" for x in again["skipped"])


def test_side_by_side_page_keeps_double_review_blind(api, rt) -> None:
    import re

    from sqlalchemy import update

    from vigil.store.models import ReviewItemRow

    convs = _seed(api, 60)
    task = _shared_task(convs)
    pair = api.get("/v1/review/side-by-side", params={"task": task}, headers=REVIEWER).json()
    a = pair["a"]["conversation_id"]
    api.post("/v1/review/items", json={"conversation_id": a}, headers=RAJ)
    with rt.sessions.begin() as s:
        s.execute(update(ReviewItemRow).where(ReviewItemRow.conversation_id == a).values(required_reviews=2))
    r = api.post(f"/v1/review/items/{a}/labels", json={"label": "unsure", "notes": "raj-only"}, headers=RAJ)
    assert r.status_code == 201, r.text
    body = {"conversation_a": a, "conversation_b": pair["b"]["conversation_id"], "choice": "a"}
    assert api.post("/v1/review/pairwise", json=body, headers=RAJ).status_code == 201
    login = api.get("/ui/login")
    token = re.search(r'name="csrf" value="([^"]+)"', login.text).group(1)  # type: ignore[union-attr]
    api.post("/ui/login", data={"csrf": token, "api_key": "rita-key", "next": "/ui/queue"})
    page = api.get("/ui/side-by-side", params={"task": task})
    assert page.status_code == 200
    assert 'class="pill label-unsure"' not in page.text  # raj's label on a blind double review
    assert "raj chose" not in page.text and "1 choice(s) by other reviewers" in page.text


def test_runs_without_a_user_turn_are_not_near_duplicates_of_each_other(api) -> None:
    """τ²'s no-user runs have no user message: with no words to compare, four unrelated runs flagged by the
    same rule made one "near-duplicate" cluster, and one label would have gone to all four."""
    convs = [c for c in simulated(40, "v1.4.0:1.0", seed=5) if c["metadata"]["simulated_defect"] == "pii_leak"][:4]
    assert len(convs) == 4
    for i, c in enumerate(convs):
        c["conversation_id"] = f"no-user-{i}"
        c["messages"] = [m for m in c["messages"] if m["role"] != "user"]
        c.pop("intent", None)
    assert api.post("/v1/conversations", json=convs, headers=INGEST).status_code == 202
    clusters = api.get("/v1/review/queue/clusters", headers=REVIEWER).json()["clusters"]
    queued = {it["conversation_id"] for it in queue_of(api)["items"]}
    assert {f"no-user-{i}" for i in range(4)} <= queued  # flagged alike, by the same rule
    clustered = {m["conversation_id"] for c in clusters for m in c["members"]}
    assert not clustered & {f"no-user-{i}" for i in range(4)}


def test_a_cluster_label_of_a_sample_stored_again_since_the_page_showed_it_is_refused(api) -> None:
    """The cluster page's form sent no revision: a sample that grew after the reviewer read it got the label
    stamped with its newer revision, text they never read, and so did its near-duplicates."""
    import re

    dups = near_duplicates(4, "grow")
    assert api.post("/v1/conversations", json=dups, headers=INGEST).status_code == 202
    [cluster] = api.get("/v1/review/queue/clusters", headers=REVIEWER).json()["clusters"]
    login = api.get("/ui/login")
    token = re.search(r'name="csrf" value="([^"]+)"', login.text).group(1)  # type: ignore[union-attr]
    api.post("/ui/login", data={"csrf": token, "api_key": "rita-key", "next": "/ui/queue"})
    page = api.get(f"/ui/clusters/{cluster['id']}").text
    shown = re.search(r'<input type="hidden" name="revision" value="(\d+)">', page)
    assert shown, "the form does not send the revision it showed"
    read = int(shown.group(1))
    sample = next(c for c in dups if c["conversation_id"] == cluster["sample"][0])
    more = [*sample["messages"], {"role": "user", "content": "And refund it."}]
    grown = api.post("/v1/conversations", json=[{**sample, "revision": read + 1, "messages": more}], headers=INGEST)
    assert grown.status_code == 202
    form = {
        "csrf": re.search(r'name="csrf" value="([^"]+)"', page).group(1),  # type: ignore[union-attr]
        "sample": sample["conversation_id"],
        "revision": str(read),
        "member": [m["conversation_id"] for m in cluster["members"]],
        "label": "not_a_failure",
    }
    r = api.post(f"/ui/clusters/{cluster['id']}/label", data=form, follow_redirects=False)
    assert r.status_code == 409 and f"you read revision {read}, it is now at revision {read + 1}" in r.text
    assert api.get("/v1/review/labels", headers=REVIEWER).json() == []


def test_a_refused_cluster_label_comes_back_with_the_members_left_unticked_and_the_label_typed(api) -> None:
    """A refused cluster label (here: the sample grew since the page showed it) showed the page again with
    every member ticked and the label and notes gone: saving again labelled the members the reviewer had
    unticked."""
    import re

    dups = near_duplicates(4, "kept")
    assert api.post("/v1/conversations", json=dups, headers=INGEST).status_code == 202
    [cluster] = api.get("/v1/review/queue/clusters", headers=REVIEWER).json()["clusters"]
    login = api.get("/ui/login")
    token = re.search(r'name="csrf" value="([^"]+)"', login.text).group(1)  # type: ignore[union-attr]
    api.post("/ui/login", data={"csrf": token, "api_key": "rita-key", "next": "/ui/queue"})
    page = api.get(f"/ui/clusters/{cluster['id']}").text
    members = [m["conversation_id"] for m in cluster["members"]]
    sample = next(c for c in dups if c["conversation_id"] == cluster["sample"][0])
    unticked = next(m for m in members if m != sample["conversation_id"])
    read = int(re.search(r'name="revision" value="(\d+)"', page).group(1))  # type: ignore[union-attr]
    more = [*sample["messages"], {"role": "user", "content": "And refund it."}]
    grown = api.post("/v1/conversations", json=[{**sample, "revision": read + 1, "messages": more}], headers=INGEST)
    assert grown.status_code == 202
    form = {
        "csrf": re.search(r'name="csrf" value="([^"]+)"', page).group(1),  # type: ignore[union-attr]
        "sample": sample["conversation_id"],
        "revision": str(read),
        "member": [m for m in members if m != unticked],
        "label": "confirmed_failure",
        "category": "privacy_leak",
        "notes": "emails the receipt to the address on file",
    }
    r = api.post(f"/ui/clusters/{cluster['id']}/label", data=form, follow_redirects=False)
    assert r.status_code == 409, r.text[-500:]
    box = r'<input type="checkbox" name="member" value="([^"]+)" form="cluster-form"([^>]*)>'
    boxes = dict(re.findall(box, r.text))
    assert set(boxes) == set(members)
    assert " checked" not in boxes[unticked] and all(" checked" in boxes[m] for m in members if m != unticked)
    assert ">emails the receipt to the address on file</textarea>" in r.text
    assert 'value="confirmed_failure" data-key="c" required checked' in r.text
    assert re.search(r'<option value="privacy_leak" data-description="[^"]*" selected>', r.text)


def test_a_cluster_label_refused_as_its_sample_was_claimed_meanwhile_says_who_holds_it(api) -> None:
    """Another reviewer claiming the sample changes the cluster, so the refused label's page answered 404
    "Cluster not found ... its items may have been labelled", without the reason nothing was saved."""
    import re

    dups = near_duplicates(4, "held")
    assert api.post("/v1/conversations", json=dups, headers=INGEST).status_code == 202
    [cluster] = api.get("/v1/review/queue/clusters", headers=REVIEWER).json()["clusters"]
    login = api.get("/ui/login")
    token = re.search(r'name="csrf" value="([^"]+)"', login.text).group(1)  # type: ignore[union-attr]
    api.post("/ui/login", data={"csrf": token, "api_key": "rita-key", "next": "/ui/queue"})
    page = api.get(f"/ui/clusters/{cluster['id']}").text
    sample = cluster["sample"][0]
    assert api.post(f"/v1/review/items/{sample}/claim", headers={"Authorization": "Bearer raj-key"}).status_code == 200
    form = {
        "csrf": re.search(r'name="csrf" value="([^"]+)"', page).group(1),  # type: ignore[union-attr]
        "sample": sample,
        "member": [m["conversation_id"] for m in cluster["members"]],
        "label": "not_a_failure",
    }
    r = api.post(f"/ui/clusters/{cluster['id']}/label", data=form, follow_redirects=False)
    assert r.status_code == 409 and "Nothing saved: raj holds this item" in r.text
    assert api.get("/v1/review/labels", headers=REVIEWER).json() == []


def test_the_side_by_side_link_shows_only_when_another_version_ran_the_task(api) -> None:
    """The conversation page linked every conversation with a task to the side-by-side page, which for a
    task run on one version only answered 422 "ran on one version only": a dead end."""
    import re

    base = {"agent_id": "sbs", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
    convs = [
        {**base, "conversation_id": "sbs-lone", "agent_version": "v1", "task_id": "lone-task"},
        {**base, "conversation_id": "sbs-old", "agent_version": "v1", "task_id": "shared-task"},
        {**base, "conversation_id": "sbs-new", "agent_version": "v2", "task_id": "shared-task"},
    ]
    assert api.post("/v1/conversations", json=convs, headers=INGEST).status_code == 202
    login = api.get("/ui/login")
    token = re.search(r'name="csrf" value="([^"]+)"', login.text).group(1)  # type: ignore[union-attr]
    api.post("/ui/login", data={"csrf": token, "api_key": "rita-key", "next": "/ui/queue"})
    lone = api.get("/ui/review/sbs-lone")
    assert lone.status_code == 200 and 'id="side-by-side"' not in lone.text
    shared = api.get("/ui/review/sbs-old")
    link = re.search(r'id="side-by-side" href="([^"]+)"', shared.text)
    assert link is not None
    target = api.get(link.group(1).replace("&amp;", "&"))
    assert target.status_code == 200 and "sbs-new" in target.text
