"""Cookie sessions of the reviewer UI: log in with a reviewer or admin API key, CSRF tokens, log out.

The cookie is signed (itsdangerous) with ``VIGIL_REVIEW_SESSION_SECRET`` and holds the key's name and
a keyed fingerprint of the key, never the key: removing a key from ``VIGIL_API_KEYS`` ends its
sessions. Every session, even before log-in, carries a random CSRF token that each form posts back;
API calls made with the cookie (not a Bearer key) must send it as ``X-CSRF-Token`` (without it: 403
"missing CSRF token", not 401, since the caller is logged in).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from typing import Any

from fastapi import HTTPException, Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer

from vigil.http.auth import KeyRing, Principal
from vigil.settings import Settings

log = logging.getLogger(__name__)

COOKIE = "vigil_session"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
UI_ROLES = ("reviewer", "admin")


class SessionManager:
    def __init__(self, secret: str, max_age: int, secure: bool) -> None:
        self.secret = secret
        self.max_age = max_age
        self.secure = secure
        self._signer = URLSafeTimedSerializer(secret, salt="vigil-ui-session")

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
                loaded = self._signer.loads(raw, max_age=self.max_age)
                data = loaded if isinstance(loaded, dict) else {}
            except BadSignature:
                data = {}
        request.state.vigil_session = data
        return data

    def principal(self, request: Request) -> Principal | None:
        """The logged-in reviewer, if the session names a key that still exists with a UI role."""
        data = self.read(request)
        name, fp = data.get("name"), data.get("fp")
        if not name or not fp:
            return None
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
        return bool(token and expected) and hmac.compare_digest(str(expected), str(token))

    def save(self, request: Request, response: Response) -> None:
        """Write the cookie if this request created or changed the session."""
        if getattr(request.state, "vigil_session_dirty", False):
            self._write(response, self.read(request))

    def login(self, request: Request, response: Response, principal: Principal, key: str) -> None:
        self.start(request, principal, key)
        self._write(response, self.read(request))

    def start(self, request: Request, principal: Principal, key: str) -> None:
        """A new logged-in session for this request; :meth:`save` writes its cookie with the response."""
        request.state.vigil_session = {
            "name": principal.name,
            "role": principal.role,
            "fp": self.fingerprint(key),
            "csrf": secrets.token_urlsafe(24),
        }
        request.state.vigil_session_dirty = True

    def logout(self, response: Response) -> None:
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


def install(app: Any, settings: Settings, announce: bool) -> SessionManager:
    """Give ``app`` its UI sessions; ``require()`` then accepts the UI cookie too (CSRF header on writes)."""
    secret = settings.review_session_secret.get_secret_value()
    if not secret:
        secret = secrets.token_urlsafe(32)
        if announce:
            log.info("VIGIL_REVIEW_SESSION_SECRET is not set: UI sessions last only as long as this process")
    sessions = SessionManager(secret, settings.review_session_max_age_seconds, settings.review_cookie_secure)
    app.state.ui_sessions = sessions
    app.state.session_principal = sessions.hook
    return sessions
