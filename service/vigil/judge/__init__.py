"""Judge stage: an LLM judge on a deterministic, targeted sample, without ever blocking the stream.

``definitions`` (judges/<name>/) → ``sampling`` (the pipeline's downstream stage: enqueue only) →
``store`` (leased queue) → ``worker`` (claims; ``attempt`` calls through ``engine`` under ``limits``; the
model is reached only through ``client``, the one module importing litellm) → ``parse`` → ``verdicts``.
``prompt`` renders transcripts as delimited data, ``offline`` is the no-key judge, ``pairwise``
compares two answers in both orders, ``api`` and ``commands`` expose it all.
"""

from __future__ import annotations

import typing

from vigil.judge import models
from vigil.judge.attempt import ask
from vigil.judge.client import Reply
from vigil.judge.engine import JudgeEngine, JudgeUnavailable
from vigil.judge.errors import ProviderError
from vigil.judge.offline import offline_verdict
from vigil.judge.parse import Parsed, parse_verdict
from vigil.judge.prompt import build_messages, check_messages
from vigil.judge.stage import JudgeStage
from vigil.runtime import Runtime, Stage

if typing.TYPE_CHECKING:
    import typer


def _wire(rt: Runtime) -> object:
    from vigil.judge.wiring import wire

    return wire(rt)


def _commands(app: typer.Typer) -> None:
    from vigil.judge.commands import register

    register(app)


STAGE = Stage("judge", _wire, models, _commands)

# what calibration (the stage that runs the judge it measures) may use
__all__ = [
    "STAGE",
    "JudgeEngine",
    "JudgeStage",
    "JudgeUnavailable",
    "Parsed",
    "ProviderError",
    "Reply",
    "ask",
    "build_messages",
    "check_messages",
    "offline_verdict",
    "parse_verdict",
]
