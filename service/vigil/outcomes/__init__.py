"""Outcomes stage: business signals that arrive later, joined to their conversations."""

from __future__ import annotations

from vigil.runtime import Runtime, Stage


def _wire(rt: Runtime) -> object:
    from vigil.outcomes.wiring import wire

    return wire(rt)


STAGE = Stage("outcomes", _wire, None, None)
