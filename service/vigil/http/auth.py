"""API keys with roles, from ``VIGIL_API_KEYS`` (``name:role:key``), sent as ``Authorization: Bearer KEY``.

``admin`` may do everything; ``reviewer`` reads and reviews; ``ingest`` only writes conversations,
outcomes and traces. With no keys configured Vigil makes one admin key per process and logs it.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from collections import defaultdict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, HTTPException, Request, status
from pydantic import SecretStr

from vigil.settings import ApiKey, Settings

log = logging.getLogger(__name__)

ROLE_GRANTS: dict[str, set[str]] = {
    "admin": {"admin", "reviewer", "ingest"},
    "reviewer": {"reviewer"},
    "ingest": {"ingest"},
}


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    def can(self, role: str) -> bool:
        return role in ROLE_GRANTS[self.role]


class KeyRing:
    def __init__(self, keys: list[ApiKey]) -> None:
        self.keys = keys

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        keys = settings.parsed_api_keys()
        if not keys:
            generated = secrets.token_urlsafe(24)
            keys = [ApiKey("local-admin", "admin", SecretStr(generated))]
            log.warning("VIGIL_API_KEYS is not set: generated an admin key for this process only: %s", generated)
        return cls(keys)

    def lookup(self, presented: str) -> Principal | None:
        found = None
        for k in self.keys:
            # compare against every key so timing does not reveal which prefix matched
            if hmac.compare_digest(k.key.get_secret_value().encode(), presented.encode()):
                found = Principal(k.name, k.role)
        return found


class KeySlots:
    """At most ``limit`` requests of one key run at once; up to ``WAITING * limit`` more wait their turn (on
    the event loop, holding no worker thread) and further ones are refused with 429. Measured without it:
    100 concurrent compare reads of one reviewer key held every worker thread, and a cheap read took
    24 s p50 (``/readyz`` 13 s, past the chart's readiness timeout)."""

    WAITING = 8

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._running: dict[str, int] = defaultdict(int)
        self._waiting: dict[str, deque[asyncio.Future[None]]] = defaultdict(deque)

    @asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        if self.limit <= 0:
            yield
            return
        if self._running[name] < self.limit:
            self._running[name] += 1
        else:
            queue = self._waiting[name]
            if len(queue) >= self.WAITING * self.limit:
                raise HTTPException(
                    status.HTTP_429_TOO_MANY_REQUESTS,
                    f"key {name!r} has {self.limit} requests running and {len(queue)} waiting "
                    "(VIGIL_KEY_CONCURRENCY); try again shortly",
                    headers={"Retry-After": "1"},
                )
            turn = asyncio.get_running_loop().create_future()
            queue.append(turn)
            try:
                await turn  # _release hands this request its slot
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._release(name)  # the slot arrived as the client went away: pass it on
                else:
                    queue.remove(turn)
                raise
        try:
            yield
        finally:
            self._release(name)

    def _release(self, name: str) -> None:
        queue = self._waiting[name]
        while queue:
            turn = queue.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._running[name] -= 1


def principal_from_request(request: Request) -> Principal | None:
    ring: KeyRing = request.app.state.keyring
    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        return ring.lookup(header[7:].strip())
    session_hook = getattr(request.app.state, "session_principal", None)
    return session_hook(request) if session_hook else None


def key_slots(request: Request) -> KeySlots:
    state = request.app.state
    slots: KeySlots | None = getattr(state, "key_slots", None)
    if slots is None:
        slots = state.key_slots = KeySlots(state.runtime.settings.key_concurrency)
    return slots


def require(*roles: str):  # type: ignore[no-untyped-def]
    """Dependency: the caller holds one of ``roles`` (admin holds all). Unless ingest is one of them (its
    endpoints share a byte budget instead), the request also takes one of its key's slots
    (``VIGIL_KEY_CONCURRENCY``) while it runs."""

    def check(request: Request) -> Principal:
        p = principal_from_request(request)
        if p is None:
            sessions = getattr(request.app.state, "ui_sessions", None)
            refusal = sessions.proxy_refusal(request) if sessions is not None else ""
            if refusal:
                raise HTTPException(status.HTTP_403_FORBIDDEN, refusal)
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "missing or unknown API key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not any(p.can(r) for r in roles):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"role {p.role!r} may not do this; needs {' or '.join(roles)}"
            )
        return p

    if "ingest" in roles:
        return Depends(check)

    async def within_slots(request: Request, p: Principal = Depends(check)) -> AsyncIterator[Principal]:
        async with key_slots(request).hold(p.name):
            yield p

    return Depends(within_slots)
