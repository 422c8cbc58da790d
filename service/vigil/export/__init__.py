"""Export stage: confirmed failures become offline eval tasks (native JSONL, Inspect AI, verifiers)."""

from __future__ import annotations

import typing

from vigil.export import models
from vigil.runtime import Runtime, Stage

if typing.TYPE_CHECKING:
    import typer


def _wire(rt: Runtime) -> None:
    from vigil.export.wiring import wire

    wire(rt)


def _commands(app: typer.Typer) -> None:
    from vigil.export.commands import register

    register(app)


STAGE = Stage("export", _wire, models, _commands)
