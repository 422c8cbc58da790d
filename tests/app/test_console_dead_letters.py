"""``/ui/dead-letters``: an admin sees refused input per reason and the latest letters (what was sent shown as
text, never as markup) and re-sends one with the page's form token; reviewers are refused; the home page
links to it for admins."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.http.test_dead_letter_replay import Later
from tests.support.app import INGEST, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.outcomes.ingest import OutcomeStore
from vigil.runtime import Runtime
from vigil.store.models import DeadLetterRow

HOSTILE = b'{"conversation_id": "<script>alert(1)</script>", "type": "chargeback", "idempotency_key": "k-1"}'


@pytest.fixture
def rt_client(sqlite_url: str) -> Iterator[tuple[Runtime, Any]]:
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    with make_client(rt, {"serve"}) as c:
        yield rt, c
    rt.close()


def log_in(c: Any, key: str) -> None:
    c.cookies.clear()
    token = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/login").text)
    assert token
    c.post("/ui/login", data={"csrf": token.group(1), "api_key": key, "next": "/ui"})


def test_an_admin_sees_the_letters_and_resends_one(rt_client) -> None:
    rt, c = rt_client
    assert c.post("/v1/outcomes", content=HOSTILE, headers=INGEST).status_code == 422
    [letter_id] = [d.id for d in _letters(rt)]

    log_in(c, "admin-key")
    assert 'href="/ui/dead-letters"' in c.get("/ui").text
    page = c.get("/ui/dead-letters")
    assert page.status_code == 200, page.text
    reasons = page.text[page.text.index('id="reasons"') :]
    assert "unknown_outcome_type" in reasons and ">1<" in reasons
    assert "<script>alert(1)</script>" not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert f'action="/ui/dead-letters/{letter_id}/replay"' in page.text

    stale = c.post(f"/ui/dead-letters/{letter_id}/replay", data={"csrf": "stale"})
    assert stale.status_code == 403
    token = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert token
    again = c.post(f"/ui/dead-letters/{letter_id}/replay", data={"csrf": token.group(1)})
    assert again.status_code == 422 and "unknown outcome type" in again.text  # not declared yet: kept
    assert _letters(rt)[0].replayed_at is None


def test_a_refusal_on_resend_reads_as_the_letters_own_detail(rt_client) -> None:
    """Refused again, the page showed the intake's whole answer as a Python dict (``{'accepted': 0, 'stored':
    0, ... 'errors': [{'index': 0, 'reason': ...}]}``): it says, as the letter's detail does, each item's reason
    and each field's error."""
    rt, c = rt_client
    short = {
        "schema_version": 1,
        "conversation_id": "c-1",
        "agent_id": "a" * 300,
        "agent_version": "v1",
        "messages": [],
    }
    assert c.post("/v1/conversations", json=short, headers=INGEST).status_code == 422
    assert c.post("/v1/conversations", content=b"{not json", headers=INGEST).status_code == 400
    assert c.post("/v1/outcomes", content=HOSTILE, headers=INGEST).status_code == 422
    schema, malformed, outcome = _letters(rt)
    log_in(c, "admin-key")
    token = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/dead-letters").text)
    assert token
    said = {}
    for letter in (schema, malformed, outcome):
        page = c.post(f"/ui/dead-letters/{letter.id}/replay", data={"csrf": token.group(1)})
        assert page.status_code == 422, page.text
        message = re.search(r'<p class="error"[^>]*>(.*?)</p>', page.text, re.S)
        assert message, page.text
        said[letter.reason] = message.group(1).strip()
    for text in said.values():
        assert "{" not in text and "accepted" not in text, text
    assert said["schema_invalid"] == (
        "The conversations intake refused it again: item 0 schema_invalid: agent_id: String should have at most "
        "256 characters; messages: List should have at least 1 item after validation, not 0"
    )
    assert said["malformed_json"].startswith(
        "The conversations intake refused it again: malformed_json: body is not JSON"
    )
    assert said["unknown_outcome_type"].startswith(
        "The outcomes intake refused it again: item 0 unknown_outcome_type: "
        "type: unknown outcome type &#39;chargeback&#39;"
    )


def test_a_letter_taken_on_resend_is_marked(rt_client) -> None:
    rt, c = rt_client
    later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    sent = {"conversation_id": "c-1", "type": "escalation", "occurred_at": later, "idempotency_key": "k-2"}
    assert c.post("/v1/outcomes", json=sent, headers=INGEST).status_code == 422
    [letter] = _letters(rt)
    rt.get(OutcomeStore).bound = Later()  # the clock has passed its time
    log_in(c, "admin-key")
    token = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/dead-letters").text)
    assert token
    r = c.post(f"/ui/dead-letters/{letter.id}/replay", data={"csrf": token.group(1)}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/ui/dead-letters?done={letter.id}"
    page = c.get(r.headers["location"]).text
    assert f"Dead letter {letter.id} re-sent and taken" in page and "re-sent 20" in page
    assert _letters(rt)[0].replayed_at is not None


def test_a_reviewer_is_refused(rt_client) -> None:
    rt, c = rt_client
    assert c.post("/v1/conversations", content=b"{not json", headers=INGEST).status_code == 400
    log_in(c, "rita-key")
    assert 'href="/ui/dead-letters"' not in c.get("/ui").text
    assert c.get("/ui/dead-letters").status_code == 403
    page = c.get("/ui")
    token = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert token
    [letter] = _letters(rt)
    assert c.post(f"/ui/dead-letters/{letter.id}/replay", data={"csrf": token.group(1)}).status_code == 403


def _letters(rt: Runtime) -> list[DeadLetterRow]:
    with rt.sessions() as s:
        rows = list(s.scalars(select(DeadLetterRow).order_by(DeadLetterRow.id)))
        s.expunge_all()
        return rows
