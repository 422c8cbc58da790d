"""The console's form posts and pages do their database work in worker threads, never on the event loop.

Its form handlers were ``async def`` and ran their sessions, queue calls and page reads on the loop: while
one waited on the database (a row lock another transaction held, SQLite's busy timeout, a slow disk), the
whole process stood still, ``/healthz``, ``/readyz``, ``/metrics`` and ingest included."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event, select, text

from tests.support.app import INGEST, served
from tests.support.console import console_runtime
from tests.support.review import review_runtime, simulated, store
from tests.support.waiting import scaled, wait_for
from vigil.runtime import Runtime
from vigil.store.models import ReviewItemRow


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF token in the page"
    return m.group(1)


def _log_in(c: Any, key: str) -> str:
    """Log ``c`` in with ``key``; returns the session's form token."""
    r = c.post("/ui/login", data={"csrf": _csrf(c.get("/ui/login").text), "api_key": key}, follow_redirects=False)
    assert r.status_code == 303, r.text[-300:]
    return _csrf(c.get("/ui/queue").text)


def _queued(rt: Runtime) -> list[str]:
    with rt.sessions() as s:
        return list(s.scalars(select(ReviewItemRow.conversation_id).order_by(ReviewItemRow.id)))


def _waiting_on_a_lock(rt: Runtime) -> int:
    with rt.engine.connect() as conn:
        return int(
            conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            )
            or 0
        )


@pytest.fixture
def pg_review(pg_url: str) -> Iterator[Runtime]:
    rt = review_runtime(pg_url)
    yield rt
    rt.close()


def test_a_label_waiting_on_a_row_lock_leaves_probes_and_ingest_answering(pg_review: Runtime) -> None:
    """Another transaction holds the review item's row lock, so a label posted from the console waits for
    it: meanwhile the process still answers its probes, its metrics and ingest."""
    rt = pg_review
    store(rt, simulated(12, "v1:0.9", seed=3))
    cid = _queued(rt)[0]
    with served(rt) as base:
        reviewer = httpx.Client(base_url=base, timeout=scaled(60))
        token = _log_in(reviewer, "rita-key")
        posted: list[httpx.Response] = []
        locker = rt.engine.connect()
        post = threading.Thread(target=lambda: None)
        try:
            locker.execute(select(ReviewItemRow).where(ReviewItemRow.conversation_id == cid).with_for_update())
            form = {"csrf": token, "label": "not_a_failure"}
            url = f"/ui/review/{cid}/label"
            post = threading.Thread(
                target=lambda: posted.append(reviewer.post(url, data=form, follow_redirects=False)), daemon=True
            )
            post.start()
            wait_for(lambda: _waiting_on_a_lock(rt), what="the label waiting on the row lock")
            others = httpx.Client(base_url=base, timeout=scaled(5))
            try:
                for probe in ("/healthz", "/readyz", "/metrics"):
                    assert others.get(probe).status_code == 200, probe
                conv = {**simulated(1, seed=99)[0], "conversation_id": "while-a-label-waits"}
                assert others.post("/v1/conversations", json=[conv], headers=INGEST).status_code == 202
            except httpx.TimeoutException as exc:
                raise AssertionError(f"the process stood still while a label waited on the database: {exc!r}") from exc
            finally:
                others.close()
            assert not posted, "the label went ahead of the lock"
        finally:
            locker.rollback()
            locker.close()
            post.join(scaled(60))
            reviewer.close()
    assert [r.status_code for r in posted] == [303]
    assert posted[0].headers["location"].endswith("?notice=labelled")


class Watched:
    """A console runtime whose engine notes each SQL statement run on an event loop, and a client of it."""

    def __init__(self, url: str) -> None:
        from fastapi.testclient import TestClient

        from vigil.app.server import build_app

        self.rt = console_runtime(url)
        store(self.rt, simulated(30, "v1:0.8", seed=4))
        self.ids = _queued(self.rt)
        self.on_loop: list[str] = []
        self.stalls: dict[str, list[str]] = {}
        event.listen(self.rt.engine, "before_cursor_execute", self._watch)
        self.client = TestClient(build_app(self.rt))

    def _watch(self, *args: Any) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # a worker thread
        self.on_loop.append(" ".join(str(args[2]).split())[:80])

    def call(self, method: str, path: str, data: dict[str, Any] | None = None) -> httpx.Response:
        self.on_loop.clear()
        r: httpx.Response = self.client.request(method, path, data=data, follow_redirects=False)
        assert r.status_code < 500, (method, path, r.status_code, r.text[-300:])
        if self.on_loop:
            self.stalls[f"{len(self.stalls)}: {method} {path} {data or ''}"] = list(self.on_loop)
        return r

    def log_in(self, key: str) -> str:
        return _log_in(self.client, key)

    def assert_no_stall(self) -> None:
        assert not self.stalls, "SQL on the event loop:\n" + "\n".join(f"{k}: {v}" for k, v in self.stalls.items())

    def close(self) -> None:
        self.client.close()
        event.remove(self.rt.engine, "before_cursor_execute", self._watch)
        self.rt.close()


@pytest.fixture
def watched(sqlite_url: str) -> Iterator[Watched]:
    w = Watched(sqlite_url)
    yield w
    w.close()


def test_no_console_form_or_error_page_queries_the_database_on_the_event_loop(watched: Watched) -> None:
    """Every form post, its refusals and the error pages: each SQL statement runs in a worker thread, none
    on the event loop (where a wait on the database stalls every other request of the process)."""
    w, ids = watched, watched.ids
    assert len(ids) >= 4
    page = w.client.get("/ui/login")
    w.call("POST", "/ui/login", {"csrf": "stale", "api_key": "rita-key"})
    w.call("POST", "/ui/login", {"csrf": _csrf(page.text), "api_key": "nope"})
    w.call("POST", "/ui/login", {"csrf": _csrf(page.text), "api_key": "rita-key"})
    token = _csrf(w.client.get("/ui/queue").text)
    w.call("GET", "/ui/nope")
    w.call("GET", "/ui/queue?page=abc")
    one, two, three, four = (f"/ui/review/{cid}" for cid in ids[:4])
    forms: list[tuple[str, dict[str, Any]]] = [
        ("/ui/queue/claim", {"csrf": token}),
        ("/ui/queue/claim", {"csrf": "stale"}),
        (one + "/release", {"csrf": token}),
        (one + "/claim", {"csrf": token}),
        (one + "/extend", {"csrf": token}),
        (one + "/label", {"csrf": token, "label": "confirmed_failure"}),  # refused: no category
        (one + "/label", {"csrf": "stale", "label": "not_a_failure"}),
        (one + "/label", {"csrf": token, "label": "not_a_failure", "next": "1"}),
        (two + "/comment", {"csrf": token, "body": "looks fine", "message_index": "0"}),
        (two + "/comment", {"csrf": token, "body": "where?", "message_index": "x"}),
        (two + "/comment", {"csrf": "stale", "body": "kept"}),
        (three + "/skip", {"csrf": token, "next": "1"}),
        ("/ui/review/nope/skip", {"csrf": token}),
        ("/ui/queue/bulk", {"csrf": token, "action": "skip", "ids": [ids[3]]}),
        ("/ui/queue/bulk", {"csrf": token, "action": "assign", "ids": [ids[3]], "assignee": "raj"}),
        ("/ui/clusters/c-nope/label", {"csrf": token, "sample": ids[3], "label": "not_a_failure"}),
        ("/ui/side-by-side/choice", {"csrf": token, "conversation_a": ids[0], "conversation_b": ids[1]}),
        ("/ui/export", {"csrf": token}),  # a reviewer may not export: the refusal page
        ("/ui/export/1/ack", {"csrf": token}),
        (four + "/label", {"csrf": token, "label": "not_a_failure"}),
        ("/ui/logout", {"csrf": token}),
        # posts after the session ended: the log-in page, what was typed kept
        (four + "/label", {"csrf": token, "label": "not_a_failure"}),
        (four + "/comment", {"csrf": token, "body": "kept"}),
        ("/ui/queue/claim", {"csrf": token}),
    ]
    for path, form in forms:
        w.call("POST", path, form)
    # log in again carrying a label: the conversation page comes back with it filled in
    page = w.client.get("/ui/login")
    draft = {"csrf": _csrf(page.text), "api_key": "rita-key", "next": four, "draft_label": "not_a_failure"}
    w.call("POST", "/ui/login", draft)
    w.call("POST", "/ui/logout", {"csrf": _csrf(w.client.get("/ui/queue").text)})
    admin = w.log_in("admin-key")
    w.call("POST", "/ui/export", {"csrf": admin, "since": "x"})
    w.call("POST", "/ui/export", {"csrf": admin, "format": "native"})
    w.call("POST", "/ui/export/999/ack", {"csrf": admin})
    w.call("POST", "/ui/export/1/ack", {"csrf": admin})
    w.assert_no_stall()


def test_no_console_page_queries_the_database_on_the_event_loop(watched: Watched) -> None:
    """The pages whose handlers were ``async def`` (conversations, compare and its drill-down) read their
    data in a worker thread but rendered on the event loop, and rendering reads the database too: the
    banners of active alerts."""
    w = watched
    w.log_in("rita-key")
    for path in (
        "/ui",
        "/ui/queue",
        f"/ui/review/{w.ids[0]}",
        "/ui/conversations",
        "/ui/conversations?id=nope",
        f"/ui/conversations?id={w.ids[0]}",
        "/ui/conversations?since=nope",
        "/ui/compare",
        "/ui/compare?agent=a&baseline=v1&candidate=v2",
        "/ui/compare/conversations?agent=a&version=v1&signal=rule:nope",
        "/ui/compare/conversations?agent=a&version=v1&signal=tasks:success",
        "/ui/clusters",
        "/ui/progress",
        "/ui/alerts",
        "/ui/export",
    ):
        w.call("GET", path)
    w.assert_no_stall()
