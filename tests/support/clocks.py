"""A replica's host clock running ahead or behind: patch a module's ``datetime`` with :func:`skewed`, or run a
replica under :func:`host_clock`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest


def skewed(hours: float) -> type[datetime]:
    """A ``datetime`` whose ``now()`` runs ``hours`` ahead (behind when negative) of the real clock."""

    class Skewed(datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def,override]
            return datetime.now(tz) + timedelta(hours=hours)

    return Skewed


@contextmanager
def host_clock(hours: float) -> Iterator[None]:
    """This process's host clock running ``hours`` ahead (behind when negative) for what runs inside, as Vigil
    and its cookie signatures read it: a replica on a host whose time sync stopped. A runtime built inside
    measures its offset from the database's clock on the skewed clock, as such a replica would at start-up."""
    real = time.time
    with pytest.MonkeyPatch.context() as m:
        for module in HOST_CLOCK_READERS:
            m.setattr(f"{module}.datetime", skewed(hours))
        m.setattr("itsdangerous.timed.time", SimpleNamespace(time=lambda: real() + hours * 3600))
        yield


# the modules whose ``datetime.now`` reads this host's clock
HOST_CLOCK_READERS = ("vigil.schema", "vigil.store.db", "vigil.ui.session")
