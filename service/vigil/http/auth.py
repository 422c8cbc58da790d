"""API keys with roles, from ``VIGIL_API_KEYS`` (``name:role:key``), sent as ``Authorization: Bearer KEY``.

``admin`` may do everything; ``reviewer`` reads and reviews; ``ingest`` only writes conversations,
outcomes and traces. With no keys configured Vigil makes one admin key per process and logs it.
"""

from __future__ import annotations

import hmac
import logging
import secrets
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


def principal_from_request(request: Request) -> Principal | None:
    ring: KeyRing = request.app.state.keyring
    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        return ring.lookup(header[7:].strip())
    session_hook = getattr(request.app.state, "session_principal", None)
    return session_hook(request) if session_hook else None


def require(*roles: str):  # type: ignore[no-untyped-def]
    """Dependency: the caller holds one of ``roles`` (admin holds all)."""

    def check(request: Request) -> Principal:
        p = principal_from_request(request)
        if p is None:
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

    return Depends(check)
