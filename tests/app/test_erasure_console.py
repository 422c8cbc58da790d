"""The console's Erase button: on a conversation's page for admins only, a confirmation page first, a form that
needs the session's CSRF token, then the rows removed; the tombstone box unticked lets it come again."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.http.test_erasure import conversation
from tests.support.app import INGEST, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.runtime import Runtime
from vigil.store.erasure import ErasedRow, ErasureRow, id_hash
from vigil.store.models import ConversationRow


@pytest.fixture
def rt_client(sqlite_url: str) -> Iterator[tuple[Runtime, Any]]:
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    with make_client(rt) as c:
        sent = [conversation("c-1"), conversation("c-2"), conversation("c-3")]
        assert c.post("/v1/conversations", json=sent, headers=INGEST).status_code == 202
        yield rt, c
    rt.close()


def log_in(c: Any, key: str) -> str:
    token = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/login").text)
    assert token
    c.post("/ui/login", data={"csrf": token.group(1), "api_key": key, "next": "/ui"})
    page = c.get("/ui/erase/c-1").text
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    return found.group(1) if found else ""


def stored(rt: Runtime, cid: str) -> bool:
    with rt.sessions() as s:
        return s.get(ConversationRow, cid) is not None


def test_an_admin_erases_a_conversation_after_confirming(rt_client) -> None:
    rt, c = rt_client
    csrf = log_in(c, "admin-key")
    page = c.get("/ui/review/c-1").text
    assert 'id="erase"' in page and 'href="/ui/erase/c-1"' in page
    confirm = c.get("/ui/erase/c-1")
    assert confirm.status_code == 200 and 'id="erase-confirm"' in confirm.text and stored(rt, "c-1")
    assert c.post("/ui/erase/c-1", data={"csrf": "forged", "tombstone": "1"}).status_code == 403
    assert stored(rt, "c-1")
    done = c.post("/ui/erase/c-1", data={"csrf": csrf, "tombstone": "1"})
    assert done.status_code == 200 and 'id="erased"' in done.text and "conversations" in done.text
    assert not stored(rt, "c-1") and stored(rt, "c-2")
    untombed = c.post("/ui/erase/c-2", data={"csrf": csrf})  # the box unticked
    assert untombed.status_code == 200 and not stored(rt, "c-2")
    with rt.sessions() as s:
        assert s.get(ErasedRow, id_hash("c-1")) is not None and s.get(ErasedRow, id_hash("c-2")) is None
        assert {r.actor for r in s.query(ErasureRow)} == {"admin"}
    assert c.post("/ui/erase/c-1", data={"csrf": csrf, "tombstone": "1"}).status_code == 404


def test_a_reviewer_sees_no_erase_button_and_cannot_erase(rt_client) -> None:
    rt, c = rt_client
    csrf = log_in(c, "rita-key")
    assert 'id="erase"' not in c.get("/ui/review/c-3").text
    assert c.get("/ui/erase/c-3").status_code == 403
    token = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/review/c-3").text)
    assert token and csrf == token.group(1)
    assert c.post("/ui/erase/c-3", data={"csrf": token.group(1), "tombstone": "1"}).status_code == 403
    assert stored(rt, "c-3")
