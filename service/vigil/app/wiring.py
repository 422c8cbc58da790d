"""The one list of Vigil's stages, in data-flow order, and how a process wires them.

Adding a stage means adding it here: its tables join the metadata Alembic sees, its ``wire`` runs for
every process, and its commands join the command line.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import MetaData

from vigil import calibration, compare, detector, evaluation, export, ingest, judge, outcomes, review
from vigil.app import home
from vigil.runtime import Runtime, Stage
from vigil.store import erasure, rollups
from vigil.store.maintenance import Maintenance
from vigil.store.models import Base

STAGES: tuple[Stage, ...] = (
    ingest.STAGE,
    judge.STAGE,
    review.STAGE,
    outcomes.STAGE,
    compare.STAGE,
    detector.STAGE,
    calibration.STAGE,
    export.STAGE,
    evaluation.STAGE,
)


def wire(rt: Runtime, roles: Iterable[str] | None = None) -> Runtime:
    """Wire every stage into ``rt``.

    ``roles`` says which process this is and so which background workers a stage may add:
    ``serve`` (API with every in-process worker: the embedded default), ``api`` (API only),
    ``consume``, ``judge-worker``, ``detector``, ``replay`` (downstream stages only, no workers).
    """
    if roles is not None:
        rt.roles = frozenset(roles)
    for stage in STAGES:
        stage.wire(rt)
    if rt.has_role("serve", "detector"):
        upkeep = Maintenance(rt.settings, rt.sessions, rt.metrics, rt.heartbeat("maintenance"))
        rt.provide(upkeep)
        if rt.has_role("serve"):
            rt.hooks.background.append(upkeep)
    home.wire(rt)
    return rt


def metadata() -> MetaData:
    """Every stage's tables (importing the stages above registered them on the shared Base), and the UI's."""
    import vigil.ui.models  # noqa: F401  (registers ui_sessions)

    assert rollups.RollupHourRow.__table__.metadata is Base.metadata  # the shared rollup tables, too
    assert erasure.ErasedRow.__table__.metadata is Base.metadata  # erasures and their tombstones
    return Base.metadata
