"""Detector stage: sequential regression detection per signal, agent and version; alerts."""

from __future__ import annotations

import typing

from vigil.detector import models
from vigil.runtime import Runtime, Stage

if typing.TYPE_CHECKING:
    import typer


def _wire(rt: Runtime) -> object:
    from vigil.detector.wiring import wire

    return wire(rt)


def _commands(app: typer.Typer) -> None:
    from vigil.detector.commands import register

    register(app)


STAGE = Stage("detector", _wire, models, _commands)
