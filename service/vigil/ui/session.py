"""Cookie sessions of the reviewer UI: log in with a reviewer or admin API key, CSRF tokens, log out.

The cookie is signed (itsdangerous) with ``VIGIL_REVIEW_SESSION_SECRET``. A logged-in cookie holds a
random session id, never the key; the session itself is a row of ``ui_sessions`` (keyed by the id's
SHA-256) naming the key and a keyed fingerprint of it. Logging out deletes the row, so a copy of the
cookie stops working too; removing a key from ``VIGIL_API_KEYS`` ends its sessions; a row past its
``VIGIL_REVIEW_SESSION_MAX_AGE_SECONDS`` is refused and swept at the next log-in. Both that expiry and the
cookie's signing time are on the database's clock (read from memory, :meth:`vigil.runtime.Runtime.now`), which
every replica shares: one whose host clock ran ahead swept the other replicas' live sessions at its log-ins, and
the others refused its cookies as signed in the future (every other request sent back to log in).
Every session, even before log-in, carries a random CSRF token that each form posts back;
API calls made with the cookie (not a Bearer key) must send it as ``X-CSRF-Token`` (without it: 403
"missing CSRF token", not 401, since the caller is logged in).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import HTTPException, Request, Response
from itsdangerous import BadSignature, TimestampSigner, URLSafeTimedSerializer
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from vigil.http.auth import KeyRing, Principal
from vigil.http.proxy_auth import ProxyAuth, ProxyIdentity
from vigil.schema import host_now
from vigil.settings import Settings
from vigil.ui.models import UiSessionRow

log = logging.getLogger(__name__)

COOKIE = "vigil_session"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
UI_ROLES = ("reviewer", "admin")


def _id_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class _Signer(TimestampSigner):
    """Cookies signed at ``now`` (the database's clock), seconds since the epoch as the timestamp's format has it."""

    def __init__(self, *args: Any, now: Callable[[], datetime], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.now = now

    def get_timestamp(self) -> int:
        return int(self.now().timestamp())


class SessionManager:
    def __init__(
        self,
        secret: str,
        max_age: int,
        secure: bool,
        db: sessionmaker[Session],
        now: Callable[[], datetime] = host_now,
        proxy: ProxyAuth | None = None,
    ) -> None:
        self.secret = secret
        self.max_age = max_age
        self.secure = secure
        self.db = db
        self.proxy = proxy
        self.now = now  # the database's clock, without a query (this host's for SQLite, which is its clock)
        self._signer = URLSafeTimedSerializer(
            secret, salt="vigil-ui-session", signer=_Signer, signer_kwargs={"now": now}
        )

    def fingerprint(self, key: str) -> str:
        return hmac.new(self.secret.encode(), key.encode(), hashlib.sha256).hexdigest()[:32]

    def read(self, request: Request) -> dict[str, Any]:
        """The session's data ({} when absent, tampered with or expired); cached per request."""
        cached = getattr(request.state, "vigil_session", None)
        if cached is not None:
            return cached  # type: ignore[no-any-return]
        data: dict[str, Any] = {}
        raw = request.cookies.get(COOKIE)
        if raw:
            try:
                loaded, signed_at = self._signer.loads(raw, return_timestamp=True)
                # a signature seconds ahead is another replica's, whose offset from the database's clock was
                # measured a few ms apart from this one's: not refused, as itsdangerous' own max_age check does
                fresh = self.now() - signed_at <= timedelta(seconds=self.max_age)
                data = loaded if fresh and isinstance(loaded, dict) else {}
            except BadSignature:
                data = {}
        request.state.vigil_session = data
        return data

    def principal(self, request: Request) -> Principal | None:
        """The logged-in reviewer: the user a trusted sign-in proxy names with a role
        (:mod:`vigil.http.proxy_auth`), else the cookie's session, if it exists, has not expired, and names
        a key that still exists with a UI role."""
        if hasattr(request.state, "vigil_principal"):
            cached: Principal | None = request.state.vigil_principal
            return cached
        found = self._proxied(request) or self._lookup(request)
        request.state.vigil_principal = found
        return found

    def _proxied(self, request: Request) -> Principal | None:
        if self.proxy is None:
            return None
        identity = self.proxy.identify(request)
        request.state.vigil_proxy_identity = identity
        if identity is None or identity.role is None:
            return None  # a refused user may still hold a key's session (an admin's way in past the proxy)
        return Principal(identity.name, identity.role)

    def proxy_identity(self, request: Request) -> ProxyIdentity | None:
        """What the sign-in proxy said of this request (None: no proxy, no header, or an untrusted peer)."""
        self.principal(request)
        return getattr(request.state, "vigil_proxy_identity", None)

    def signed_in_by_proxy(self, request: Request) -> bool:
        """The user is the one the sign-in proxy names (not a key's session)."""
        identity = self.proxy_identity(request)
        p = self.principal(request)
        return identity is not None and p is not None and identity.name == p.name and identity.role == p.role

    def can_log_out(self, request: Request) -> bool:
        """A key's session ends at Log out; a proxy's user leaves only through the proxy's sign-out, so the
        button is shown for them only when VIGIL_AUTH_PROXY_LOGOUT_URL names it."""
        return not self.signed_in_by_proxy(request) or bool(self.proxy and self.proxy.logout_url)

    def proxy_refusal(self, request: Request) -> str:
        """Why the user the proxy names was not let in, when no key's session let them in either."""
        identity = self.proxy_identity(request)
        if identity is None or self.principal(request) is not None:
            return ""
        return identity.refusal

    def _lookup(self, request: Request) -> Principal | None:
        sid = self.read(request).get("sid")
        if not sid or not isinstance(sid, str):
            return None
        with self.db() as s:
            row = s.get(UiSessionRow, _id_hash(sid))
            if row is None:
                return None
            expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=UTC)
            if expires <= self.now():
                return None
            name, fp = row.key_name, row.fingerprint
        ring: KeyRing = request.app.state.keyring
        for k in ring.keys:
            if (
                k.name == name
                and k.role in UI_ROLES
                and hmac.compare_digest(self.fingerprint(k.key.get_secret_value()), str(fp))
            ):
                return Principal(k.name, k.role)
        return None

    def hook(self, request: Request) -> Principal | None:
        """``app.state.session_principal``: cookie auth for the API, with CSRF header on writes."""
        p = self.principal(request)
        if p is None or request.method in SAFE_METHODS:
            return p
        token = request.headers.get(CSRF_HEADER)
        if self.csrf_ok(request, token):
            return p
        what = "stale CSRF token" if token else "missing CSRF token"
        raise HTTPException(
            403,
            f"{what}: a call with the session cookie must send the page's token as X-CSRF-Token "
            "(or authenticate with a Bearer key)",
        )

    def csrf_token(self, request: Request) -> str:
        data = self.read(request)
        if not data.get("csrf"):
            data["csrf"] = secrets.token_urlsafe(24)
            request.state.vigil_session_dirty = True
        return str(data["csrf"])

    def csrf_ok(self, request: Request, token: str | None) -> bool:
        expected = self.read(request).get("csrf")
        # compared as bytes: compare_digest refuses a str holding non-ASCII with a TypeError, which made a
        # posted token such as "é" a 500 on every form instead of the stale-form answer
        return bool(token and expected) and hmac.compare_digest(_bytes(expected), _bytes(token))

    def save(self, request: Request, response: Response) -> None:
        """Write the cookie if this request created or changed the session."""
        if getattr(request.state, "vigil_session_dirty", False):
            self._write(response, self.read(request))

    def login(self, request: Request, response: Response, principal: Principal, key: str) -> None:
        self.start(request, principal, key)
        self._write(response, self.read(request))

    def start(self, request: Request, principal: Principal, key: str) -> None:
        """A new logged-in session for this request; :meth:`save` writes its cookie with the response.

        The session id is new (a session fixed before log-in is never promoted) and so is the CSRF token.
        """
        self.end(request)
        sid = secrets.token_urlsafe(32)
        now = self.now()
        with self.db.begin() as s:
            s.execute(delete(UiSessionRow).where(UiSessionRow.expires_at < now))
            s.add(
                UiSessionRow(
                    id_hash=_id_hash(sid),
                    key_name=principal.name,
                    role=principal.role,
                    fingerprint=self.fingerprint(key),
                    created_at=now,
                    expires_at=now + timedelta(seconds=self.max_age),
                )
            )
        request.state.vigil_session = {"sid": sid, "csrf": secrets.token_urlsafe(24)}
        request.state.vigil_session_dirty = True
        request.state.vigil_principal = Principal(principal.name, principal.role)

    def end(self, request: Request) -> None:
        """Revoke this request's logged-in session (its row is deleted: every copy of the cookie ends)."""
        sid = self.read(request).get("sid")
        if sid and isinstance(sid, str):
            with self.db.begin() as s:
                s.execute(delete(UiSessionRow).where(UiSessionRow.id_hash == _id_hash(sid)))
        request.state.vigil_principal = None

    def logout(self, request: Request, response: Response) -> None:
        self.end(request)
        response.delete_cookie(COOKIE, path="/", secure=self.secure, httponly=True, samesite="lax")

    def _write(self, response: Response, data: dict[str, Any]) -> None:
        response.set_cookie(
            COOKIE,
            self._signer.dumps(data),
            max_age=self.max_age,
            path="/",
            secure=self.secure,
            httponly=True,
            samesite="lax",
        )


def install(
    app: Any,
    settings: Settings,
    announce: bool,
    db: sessionmaker[Session],
    now: Callable[[], datetime] = host_now,
) -> SessionManager:
    """Give ``app`` its UI sessions; ``require()`` then accepts the UI cookie too (CSRF header on writes).
    ``now``: the database's clock without a query (:meth:`vigil.runtime.Runtime.now`)."""
    secret = settings.review_session_secret.get_secret_value()
    if not secret:
        secret = secrets.token_urlsafe(32)
        if announce:
            log.info("VIGIL_REVIEW_SESSION_SECRET is not set: UI sessions last only as long as this process")
    proxy = ProxyAuth.from_settings(settings)
    sessions = SessionManager(
        secret, settings.review_session_max_age_seconds, settings.review_cookie_secure, db, now, proxy
    )
    app.state.ui_sessions = sessions
    app.state.session_principal = sessions.hook
    return sessions


def _bytes(value: object) -> bytes:
    """A token as bytes to compare (a lone surrogate a form decoded is kept, not an encoding error)."""
    return str(value).encode("utf-8", "surrogatepass")
