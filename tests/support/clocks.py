"""A replica's host clock running ahead or behind: patch a module's ``datetime`` with :func:`skewed`, or run a
replica under :func:`host_clock`."""

from __future__ import annotations

import sys
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
    """This process's host clock running ``hours`` ahead (behind when negative) for what runs inside, as every
    Vigil module and cookie signatures read it: a replica on a host whose time sync stopped. A runtime built
    inside measures its offset from the database's clock on the skewed clock, as such a replica does at start-up;
    all it does must run inside too."""
    real = time.time
    ahead = skewed(hours)
    with pytest.MonkeyPatch.context() as m:
        for name, module in list(sys.modules.items()):
            if (name == "vigil" or name.startswith("vigil.")) and getattr(module, "datetime", None) is datetime:
                m.setattr(module, "datetime", ahead)
        m.setattr("itsdangerous.timed.time", SimpleNamespace(time=lambda: real() + hours * 3600))
        yield
