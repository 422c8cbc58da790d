"""Logged-in UI sessions, kept server-side so that logging out revokes them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from vigil.store.db import utcnow
from vigil.store.models import Base


class UiSessionRow(Base):
    """One logged-in browser session. The cookie holds a random id; only its SHA-256 is stored, so the
    table does not hold usable session ids. Deleting the row (log-out) ends the session everywhere the
    cookie was copied to."""

    __tablename__ = "ui_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(32))
    fingerprint: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)
