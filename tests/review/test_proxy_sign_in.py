"""Single sign-on through an authenticating proxy: the user a trusted proxy names in a header works the
console and the API with the role their groups give; the same header from anyone else is ignored; a user
with no role is told so; writes still need the page's CSRF token."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from tests.support.app import make_settings
from tests.support.review import review_runtime, simulated, store
from tests.support.services import free_port, wait_port
from vigil.app.server import build_app
from vigil.errors import ConfigError
from vigil.http.protocol import GuardedHttpProtocol
from vigil.http.proxy_auth import PEER_SCOPE_KEY, ProxyAuth
from vigil.runtime import Runtime

PROXY = {
    "auth_proxy_user_header": "X-Forwarded-Email",
    "auth_proxy_groups_header": "X-Forwarded-Groups",
    "auth_proxy_roles": '{"vigil-admins": "admin", "support-qa": "reviewer"}',
    "auth_proxy_trusted_networks": "10.0.0.0/8",
}
SIDECAR = "10.0.0.5"  # the proxy's address, inside the trusted network
OUTSIDE = "192.168.7.9"


def headers(user: str, groups: str = "") -> dict[str, str]:
    return {"X-Forwarded-Email": user, "X-Forwarded-Groups": groups}


@pytest.fixture
def proxied(sqlite_url: str) -> Iterator[Runtime]:
    rt = review_runtime(sqlite_url, **PROXY, auth_proxy_logout_url="/oauth2/sign_out")
    yield rt
    rt.close()


def client(rt: Runtime, peer: str) -> TestClient:
    return TestClient(build_app(rt), client=(peer, 40000), follow_redirects=False)


def csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF token on the page"
    return m.group(1)


def test_a_signed_in_reviewer_works_the_queue_and_labels_in_their_own_name(proxied: Runtime) -> None:
    convs = simulated(30)
    store(proxied, convs)
    with client(proxied, SIDECAR) as c:
        reviewer = headers("alice@example.com", "everyone, support-qa")
        page = c.get("/ui/queue", headers=reviewer)
        assert page.status_code == 200, page.text
        assert "alice@example.com" in page.text and 'title="role: reviewer"' in page.text
        assert c.get("/v1/review/audit", headers=reviewer).status_code == 403  # an admin's read
        queue = c.get("/v1/review/queue", headers=reviewer).json()
        item = queue["items"][0]["conversation_id"]
        # a write with the proxy's header alone (the browser's cookies and the proxy's header ride along on
        # any cross-site request) is refused without the page's token
        label = {"label": "not_a_failure"}
        refused = c.post(f"/v1/review/items/{item}/labels", json=label, headers=reviewer)
        assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
        token = csrf(page.text)
        done = c.post(f"/v1/review/items/{item}/labels", json=label, headers={**reviewer, "X-CSRF-Token": token})
        assert done.status_code == 201, done.text
        assert done.json()["reviewer"] == "alice@example.com"
        admin = headers("bob@example.com", "support-qa,vigil-admins")  # the highest role of their groups
        audit = c.get("/v1/review/audit", headers=admin)
        assert audit.status_code == 200
        assert any(e["actor"] == "alice@example.com" for e in audit.json()), audit.json()


def test_the_header_from_anyone_but_the_proxy_is_ignored(proxied: Runtime) -> None:
    with client(proxied, OUTSIDE) as c:
        forged = headers("mallory@example.com", "vigil-admins")
        page = c.get("/ui/queue", headers=forged)
        assert page.status_code == 303 and page.headers["location"].startswith("/ui/login")
        assert c.get("/v1/review/queue", headers=forged).status_code == 401
        assert c.get("/v1/review/queue", headers={**forged, "Authorization": "Bearer rita-key"}).status_code == 200


def test_a_user_without_a_role_is_told_why_and_an_admin_key_still_logs_in(proxied: Runtime) -> None:
    with client(proxied, SIDECAR) as c:
        stranger = headers("eve@example.com", "marketing")
        page = c.get("/ui/queue", headers=stranger)
        assert page.status_code == 403
        assert "eve@example.com is signed in, but none of their groups (marketing)" in page.text
        api = c.get("/v1/review/queue", headers=stranger)
        assert api.status_code == 403 and "VIGIL_AUTH_PROXY_ROLES" in api.json()["detail"]
        login = c.get("/ui/login", headers=stranger)
        assert login.status_code == 200 and "none of their groups" in login.text
        posted = c.post(
            "/ui/login",
            data={"csrf": csrf(login.text), "api_key": "admin-key", "next": "/ui/queue"},
            headers=stranger,
        )
        assert posted.status_code == 303
        assert c.get("/ui/queue", headers=stranger).status_code == 200


def test_log_in_and_log_out_for_a_user_the_proxy_signed_in(proxied: Runtime, sqlite_url: str) -> None:
    with client(proxied, SIDECAR) as c:
        user = headers("alice@example.com", "support-qa")
        assert c.get("/ui/login?next=/ui/conversations", headers=user).headers["location"] == "/ui/conversations"
        page = c.get("/ui/queue", headers=user)
        assert "Log out" in page.text
        out = c.post("/ui/logout", data={"csrf": csrf(page.text)}, headers=user)
        assert out.status_code == 303 and out.headers["location"] == "/oauth2/sign_out"
    rt = review_runtime(sqlite_url, **PROXY)  # no sign-out address: no button that would lead back in
    try:
        with client(rt, SIDECAR) as c:
            page = c.get("/ui/queue", headers=headers("alice@example.com", "support-qa"))
            assert page.status_code == 200 and "Log out" not in page.text
    finally:
        rt.close()


@contextmanager
def serving(rt: Runtime) -> Iterator[str]:
    """``rt`` served as ``vigil serve`` serves it: uvicorn with its proxy-headers middleware on (its default,
    trusting X-Forwarded-For from 127.0.0.1) and Vigil's HTTP protocol."""
    port = free_port()
    config = uvicorn.Config(build_app(rt), host="127.0.0.1", port=port, http=GuardedHttpProtocol, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert wait_port(port), "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize(
    ("trusted", "forwarded_for", "signed_in"),
    [
        # a sidecar on the loopback: uvicorn puts the browser's address from X-Forwarded-For in the scope,
        # and the header is still the proxy's, since the connection is
        ("127.0.0.1/32", "203.0.113.9", True),
        # the attack: a client on the loopback claims, by X-Forwarded-For, to come from the proxy's network
        ("10.0.0.0/8", "10.1.2.3", False),
    ],
)
def test_the_connection_itself_must_come_from_the_proxy(
    sqlite_url: str, trusted: str, forwarded_for: str, signed_in: bool
) -> None:
    rt = review_runtime(sqlite_url, **{**PROXY, "auth_proxy_trusted_networks": trusted})
    try:
        with serving(rt) as base:
            sent: dict[str, Any] = {**headers("alice@example.com", "support-qa"), "X-Forwarded-For": forwarded_for}
            r = httpx.get(f"{base}/v1/review/queue", headers=sent, timeout=30)
            assert r.status_code == (200 if signed_in else 401), r.text
    finally:
        rt.close()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"auth_proxy_trusted_networks": ""}, "VIGIL_AUTH_PROXY_TRUSTED_NETWORKS is empty"),
        ({"auth_proxy_trusted_networks": "10.0.0.0/33"}, "is not an address or network"),
        ({"auth_proxy_roles": "{vigil-admins: admin}"}, "VIGIL_AUTH_PROXY_ROLES is not JSON"),
        ({"auth_proxy_roles": '{"ops": "ingest"}'}, "maps to 'ingest', not reviewer or admin"),
        ({"auth_proxy_roles": "", "auth_proxy_default_role": ""}, "no user could get a role"),
        ({"auth_proxy_default_role": "owner"}, "must be reviewer, admin or empty"),
        ({"auth_proxy_groups_header": ""}, "VIGIL_AUTH_PROXY_GROUPS_HEADER is not set"),
        ({"auth_proxy_user_header": "Authorization"}, "must not be Authorization or Cookie"),
        ({"auth_proxy_user_header": "X Email"}, "is not an HTTP header name"),
        ({"auth_proxy_logout_url": "javascript:alert(1)"}, "absolute URL or a path"),
    ],
)
def test_settings_that_cannot_work_are_refused_at_start(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ProxyAuth.from_settings(make_settings("sqlite://", **{**PROXY, **overrides}))


def test_off_unless_a_user_header_is_named() -> None:
    assert ProxyAuth.from_settings(make_settings("sqlite://")) is None


def test_a_second_user_header_is_refused_not_read_first_come(proxied: Runtime) -> None:
    """A proxy that adds its header after the client's (rather than replacing it) would otherwise let the
    client's own line, read first, name the user: two user lines are refused, whoever sent them."""
    with client(proxied, SIDECAR) as c:
        sent = [
            ("X-Forwarded-Email", "mallory@example.com"),
            ("X-Forwarded-Email", "alice@example.com"),
            ("X-Forwarded-Groups", "support-qa"),
        ]
        page = c.get("/ui/queue", headers=sent)
        assert page.status_code == 403 and "more than once" in page.text
        assert "mallory@example.com" not in page.text
        assert c.get("/v1/review/queue", headers=sent).status_code == 403


def test_a_connection_whose_peer_is_unknown_is_not_trusted_by_its_forwarded_client(proxied: Runtime) -> None:
    """vigil serve's protocol records no peer when the socket cannot tell it; the scope's client may then
    be X-Forwarded-For's (uvicorn trusts that header from a client it cannot place when told to trust
    any), so it must not stand in for the peer."""
    app = build_app(proxied)

    async def unknown_peer(scope: Any, receive: Any, send: Any) -> None:
        scope[PEER_SCOPE_KEY] = None  # what the protocol records when the socket has no peer address
        await app(scope, receive, send)

    with TestClient(unknown_peer, client=(SIDECAR, 40000), follow_redirects=False) as c:
        r = c.get("/v1/review/queue", headers=headers("alice@example.com", "support-qa"))
        assert r.status_code == 401, r.text


def test_names_and_groups_the_proxy_sends_in_utf8_are_read_as_utf8(sqlite_url: str) -> None:
    """HTTP headers reach the app as Latin-1; a proxy names users and groups in UTF-8, so "zoë" had been
    labelling as "zoÃ«" and a group "qualité" had never matched its mapping."""
    rt = review_runtime(sqlite_url, **{**PROXY, "auth_proxy_roles": '{"qualité": "reviewer"}'})
    try:
        store(rt, simulated(5))
        with client(rt, SIDECAR) as c:
            sent = [(b"X-Forwarded-Email", "zoë@example.com".encode()), (b"X-Forwarded-Groups", "qualité".encode())]
            page = c.get("/ui/queue", headers=sent)
            assert page.status_code == 200, page.text
            assert ">zoë@example.com<" in page.text
            item = c.get("/v1/review/queue", headers=sent).json()["items"][0]["conversation_id"]
            done = c.post(
                f"/v1/review/items/{item}/labels",
                json={"label": "not_a_failure"},
                headers=[*sent, (b"X-CSRF-Token", csrf(page.text).encode())],
            )
            assert done.status_code == 201 and done.json()["reviewer"] == "zoë@example.com", done.text
            bad = [(b"X-Forwarded-Email", b"z\xffo@example.com"), (b"X-Forwarded-Groups", b"support-qa")]
            assert c.get("/v1/review/queue", headers=bad).status_code == 403  # not UTF-8: refused, not guessed
    finally:
        rt.close()


def test_a_user_in_many_groups_gets_the_role_of_a_group_past_the_shown_ones(proxied: Runtime) -> None:
    """A directory user can be in hundreds of groups; the ones kept for display are capped, the role is
    not: an admin group listed 250th had left its user refused."""
    many = ", ".join([f"team-{i}" for i in range(250)] + ["vigil-admins"])
    with client(proxied, SIDECAR) as c:
        assert c.get("/v1/review/audit", headers=headers("carol@example.com", many)).status_code == 200
