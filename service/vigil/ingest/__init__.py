"""Ingest: every way a conversation comes in (HTTP, Kafka, OTLP, replay, demo) calls one decoder and one pipeline."""

from __future__ import annotations

import typing

from vigil.ingest.otlp import models
from vigil.runtime import Runtime, Stage

if typing.TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import typer

    from vigil.schema import Conversation


def load_file(path: Path, fmt: str = "auto") -> Iterator[Conversation]:
    """The conversations of a recorded file in any format the importers read (``vigil replay``'s reader).

    Bad input raises a ``VigilError`` naming the file and item.
    """
    from vigil.ingest.importers import load_file as load

    return load(path, fmt)  # type: ignore[arg-type]


def _wire(rt: Runtime) -> None:
    from vigil.ingest.wiring import wire

    wire(rt)


def _commands(app: typer.Typer) -> None:
    from vigil.ingest.commands import register

    register(app)


STAGE = Stage("ingest", _wire, models, _commands)
