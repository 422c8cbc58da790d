"""Calibration stage: the judge's agreement with reviewers and labelled sets; corrected rates."""

from __future__ import annotations

import typing

from vigil.calibration import models
from vigil.runtime import Runtime, Stage

if typing.TYPE_CHECKING:
    import typer


def _wire(rt: Runtime) -> object:
    from vigil.calibration.wiring import wire

    return wire(rt)


def _commands(app: typer.Typer) -> None:
    from vigil.calibration.commands import register

    register(app)


STAGE = Stage("calibration", _wire, models, _commands)
