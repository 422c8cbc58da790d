"""Tables of this stage (on the shared declarative Base)."""

from __future__ import annotations

from ..store.models import Base  # noqa: F401
