"""A replica's host clock running ahead or behind: patch a module's ``datetime`` with :func:`skewed`."""

from __future__ import annotations

from datetime import datetime, timedelta


def skewed(hours: float) -> type[datetime]:
    """A ``datetime`` whose ``now()`` runs ``hours`` ahead (behind when negative) of the real clock."""

    class Skewed(datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def,override]
            return datetime.now(tz) + timedelta(hours=hours)

    return Skewed
