"""Compare stage: quality signals per agent version with intervals, and version comparison."""

from __future__ import annotations

import typing

from vigil.compare.paired import (
    EMPTY,
    Interval,
    Rollouts,
    clustered_mean,
    difference,
    pass_k,
    per_task,
    powers_of_two,
)
from vigil.compare.stats import holm, pass_at_k, pass_hat_k, spread_free_p_value
from vigil.compare.tasks import protocol_of
from vigil.runtime import Runtime, Stage

if typing.TYPE_CHECKING:
    import typer


def _wire(rt: Runtime) -> None:
    from vigil.compare.wiring import wire

    wire(rt)


def _commands(app: typer.Typer) -> None:
    from vigil.compare.commands import register

    register(app)


STAGE = Stage("compare", _wire, None, _commands)

__all__ = [
    "EMPTY",
    "STAGE",
    "Interval",
    "Rollouts",
    "clustered_mean",
    "difference",
    "holm",
    "pass_at_k",
    "pass_hat_k",
    "pass_k",
    "per_task",
    "powers_of_two",
    "protocol_of",
    "spread_free_p_value",
]
