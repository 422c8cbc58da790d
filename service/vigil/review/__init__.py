"""Review stage: the flagger fills a leased queue; reviewers label it in the API and the web UI."""

from __future__ import annotations

import typing

from vigil.review import models
from vigil.review.policy import FlaggingPolicy
from vigil.runtime import Runtime, Stage

if typing.TYPE_CHECKING:
    import typer


def _wire(rt: Runtime) -> object:
    from vigil.review.wiring import wire

    return wire(rt)


def _commands(app: typer.Typer) -> None:
    from vigil.review.commands import register

    register(app)


STAGE = Stage("review", _wire, models, _commands)

__all__ = ["STAGE", "FlaggingPolicy"]
