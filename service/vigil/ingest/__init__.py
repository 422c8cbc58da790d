"""Ingest: every way a conversation comes in (HTTP, Kafka, OTLP, replay, demo) calls one decoder and one pipeline."""

from __future__ import annotations

import typing

from vigil.ingest.otlp import models
from vigil.runtime import Runtime, Stage

if typing.TYPE_CHECKING:
    import typer


def _wire(rt: Runtime) -> None:
    from vigil.ingest.wiring import wire

    wire(rt)


def _commands(app: typer.Typer) -> None:
    from vigil.ingest.commands import register

    register(app)


STAGE = Stage("ingest", _wire, models, _commands)
