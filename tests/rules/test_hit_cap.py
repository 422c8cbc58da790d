"""One rule stores at most VIGIL_RULE_MAX_HITS findings per conversation: a conversation in which a rule
hits thousands of times (a user who repeats one line, crafted or not) cannot turn into thousands of
finding rows, and the last stored finding says how many hits were left out."""

from __future__ import annotations

from collections import Counter

import orjson
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import ADMIN, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.rules.packs import RuleEngine
from vigil.schema import Conversation
from vigil.settings import PROJECT_ROOT
from vigil.store.models import FindingRow

REPEATS = 60  # the user says the same line 60 times: 59 "user-repeated" hits


def _repeating(cid: str = "rep-1") -> dict[str, object]:
    messages: list[dict[str, str]] = []
    for i in range(REPEATS):
        messages.append({"role": "user", "content": "I need to change my flight to Boston please, booking ABC123"})
        messages.append({"role": "assistant", "content": f"Sure, let me look at option {i}."})
    return {"conversation_id": cid, "agent_id": "a", "agent_version": "v", "messages": messages}


def _engine(max_hits: int | None = None) -> RuleEngine:
    engine = RuleEngine.from_paths([PROJECT_ROOT / "rules" / "default.yaml"])
    if max_hits is not None:
        engine.max_hits = max_hits
    return engine


def test_a_rule_stores_at_most_its_cap_and_counts_what_it_left_out() -> None:
    conv = Conversation.model_validate(_repeating())
    capped = [f for f in _engine(3).evaluate(conv) if f.rule_id == "user-repeated"]
    assert len(capped) == 3
    assert [f.details.get("hits_not_stored") for f in capped] == [None, None, REPEATS - 1 - 3]
    assert f"and {REPEATS - 1 - 3} more of this rule" in capped[-1].message
    default = [f for f in _engine().evaluate(conv) if f.rule_id == "user-repeated"]
    assert len(default) == 50 and default[-1].details["hits_not_stored"] == REPEATS - 1 - 50


def test_a_rule_under_its_cap_is_unchanged() -> None:
    conv = Conversation.model_validate(_repeating())
    found = [f for f in _engine(REPEATS - 1).evaluate(conv) if f.rule_id == "user-repeated"]
    assert len(found) == REPEATS - 1 and not any("hits_not_stored" in f.details for f in found)


def test_the_setting_bounds_the_rows_stored(sqlite_url: str) -> None:
    rt = build_runtime(make_settings(sqlite_url, rule_max_hits=4), registry=CollectorRegistry())
    try:
        with make_client(rt) as client:
            r = client.post(
                "/v1/conversations",
                content=orjson.dumps(_repeating("rep-stored")),
                headers={**ADMIN, "Content-Type": "application/json"},
            )
            assert r.status_code == 202, r.text
        with rt.sessions() as s:
            rows = s.execute(
                select(FindingRow.rule_id, FindingRow.details).where(FindingRow.conversation_id == "rep-stored")
            ).all()
        per_rule = Counter(rule for rule, _ in rows)
        assert per_rule["user-repeated"] == 4
        assert [d.get("hits_not_stored") for rule, d in rows if rule == "user-repeated"].count(REPEATS - 1 - 4) == 1
    finally:
        rt.close()
