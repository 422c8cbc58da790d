"""Evaluation: how well the rule packs find failures (``vigil rules evaluate``, ``GET /v1/rules/quality``)
and the release gate for CI (``vigil gate``), on offline result files and on stored traffic."""

from __future__ import annotations

import typing

from vigil.runtime import Runtime, Stage

if typing.TYPE_CHECKING:
    import typer


def _wire(rt: Runtime) -> None:
    from vigil.evaluation.wiring import wire

    wire(rt)


def _commands(app: typer.Typer) -> None:
    from vigil.evaluation.commands import register

    register(app)


STAGE = Stage("evaluation", _wire, None, _commands)
