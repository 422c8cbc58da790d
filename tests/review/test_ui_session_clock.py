"""Reviewer UI sessions across two API replicas sharing one Postgres database, one of them on a host whose clock
runs 3 h ahead or behind (:func:`tests.support.clocks.host_clock`): a session logged in through either replica
lasts ``VIGIL_REVIEW_SESSION_MAX_AGE_SECONDS`` on the database's clock, through both."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from tests.review.test_review_ui import _csrf
from tests.support.clocks import host_clock
from tests.support.review import review_client, review_runtime
from vigil.ui.models import UiSessionRow
from vigil.ui.session import COOKIE

HOUR = 3600  # the sessions' maximum age: shorter than the skew, as a shift's session is than a host's drift
SECRET = "one-secret-for-every-replica"


class Replica:
    """One API replica: its client, and the host clock its requests run on."""

    def __init__(self, url: str, hours: float) -> None:
        self.hours = hours
        with self.clock():  # built, and its offset from the database's clock measured, on its own host's clock
            self.rt = review_runtime(url, review_session_max_age_seconds=HOUR, review_session_secret=SECRET)
        self.client = review_client(self.rt)

    def clock(self) -> AbstractContextManager[None]:
        return host_clock(self.hours) if self.hours else nullcontext()

    def get(self, path: str, cookie: str | None) -> Any:
        self.client.cookies.clear()
        if cookie is not None:
            self.client.cookies.set(COOKIE, cookie)
        with self.clock():
            return self.client.get(path, follow_redirects=False)

    def login(self, key: str) -> str:
        """Log in with ``key`` through this replica; the session cookie."""
        self.client.cookies.clear()
        with self.clock():
            page = self.client.get("/ui/login")
            r = self.client.post(
                "/ui/login",
                data={"csrf": _csrf(page.text), "api_key": key, "next": "/ui/queue"},
                follow_redirects=False,
            )
        assert r.status_code == 303, r.text
        cookie = self.client.cookies.get(COOKIE)
        assert cookie
        return cookie

    def who(self, cookie: str) -> str | None:
        """The reviewer this replica takes the cookie for (None: it sends the browser to log in)."""
        r = self.get("/ui/queue", cookie)
        if r.status_code == 303:
            assert r.headers["location"].startswith("/ui/login"), r.headers
            return None
        assert r.status_code == 200, r.text
        return "rita" if ">rita<" in r.text else "raj" if ">raj<" in r.text else "?"

    def close(self) -> None:
        self.client.close()
        self.rt.close()


@pytest.fixture
def replicas(pg_url: str) -> Iterator[Any]:
    made: list[Replica] = []

    def make(hours: float) -> Replica:
        made.append(Replica(pg_url, hours))
        return made[-1]

    yield make
    for r in made:
        r.close()


def expiries(replica: Replica) -> dict[str, datetime]:
    with replica.rt.sessions() as s:
        rows = s.execute(select(UiSessionRow.key_name, UiSessionRow.expires_at)).all()
    return {name: at if at.tzinfo else at.replace(tzinfo=UTC) for name, at in rows}


def test_a_replica_whose_clock_runs_ahead_neither_ends_nor_refuses_the_others_sessions(replicas) -> None:  # type: ignore[no-untyped-def]
    """Through a replica 3 h ahead, raj's log-in swept every session expiring before its clock as expired
    (rita's, logged in through the other replica a moment before, with it); and the other replica refused
    raj's cookie as signed 3 h in the future, so he was sent back to log in on every other request."""
    on_time, ahead = replicas(0), replicas(3)
    rita = on_time.login("rita-key")
    raj = ahead.login("raj-key")
    for replica in (on_time, ahead):
        assert (replica.who(rita), replica.who(raj)) == ("rita", "raj")
    soon = datetime.now(UTC) + timedelta(seconds=HOUR)
    for name, at in expiries(on_time).items():  # held an hour, not the 4 h of raj's host clock
        assert abs(at - soon) < timedelta(minutes=1), (name, at)


def test_a_replica_whose_clock_runs_behind_writes_sessions_that_last_their_maximum_age(replicas) -> None:  # type: ignore[no-untyped-def]
    """A log-in through a replica 3 h behind wrote a session that had expired 2 h before on every other
    replica's clock (and signed its cookie 3 h in the past, past the hour's maximum age): logged out at once.
    That replica also refused the other's cookies, signed in what was its future."""
    on_time, behind = replicas(0), replicas(-3)
    rita = behind.login("rita-key")
    raj = on_time.login("raj-key")
    for replica in (on_time, behind):
        assert (replica.who(rita), replica.who(raj)) == ("rita", "raj")
    soon = datetime.now(UTC) + timedelta(seconds=HOUR)
    assert abs(expiries(on_time)["rita"] - soon) < timedelta(minutes=1)
