"""``GET /v1/alerts``: current and past detections, with when they started and ended, and which of them
repeat each other (``folded_into`` / ``folds``: :mod:`vigil.detector.twins`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from fastapi import APIRouter, Query, Request
from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from vigil.detector.models import DetectionRow, DetectorSeriesRow
from vigil.detector.twins import FedBy, fed_by_rules, mark_twins
from vigil.http import runtime_of
from vigil.http.auth import require
from vigil.store.db import aware

router = APIRouter(tags=["alerts"])


def detection_dict(d: DetectionRow) -> dict[str, Any]:
    return {
        "id": d.id,
        "signal": d.signal,
        "agent_id": d.agent_id,
        "agent_version": d.agent_version,
        "active": d.ended_at is None,
        "started_at": aware(d.started_at),
        "ended_at": aware(d.ended_at),
        "end_reason": d.end_reason,
        "baseline": d.baseline,
        "baseline_rate": d.baseline_rate,
        "rate_at_start": d.rate,
        "observations_at_start": d.observations,
        "statistic_at_start": d.statistic,
        "threshold": d.threshold,
    }


def list_alerts(
    s: Session,
    fed_by: FedBy,
    active: bool | None = None,
    agent: str | None = None,
    version: str | None = None,
    limit: int = 100,
    signals: Collection[str] | None = None,
) -> dict[str, Any]:
    """The newest ``limit`` detections (of ``signals`` only, when given), each marked with the alerts it
    repeats or is repeated by (:func:`vigil.detector.twins.mark_twins`; ``fed_by`` is
    :func:`~vigil.detector.twins.fed_by_rules`)."""
    q = select(DetectionRow)
    if signals is not None:
        q = q.where(DetectionRow.signal.in_(sorted(signals)))
    if active is True:
        q = q.where(DetectionRow.ended_at.is_(None))
    elif active is False:
        q = q.where(DetectionRow.ended_at.is_not(None))
    if agent:
        q = q.where(DetectionRow.agent_id == agent)
    if version:
        q = q.where(DetectionRow.agent_version == version)
    rows = s.scalars(q.order_by(DetectionRow.started_at.desc(), DetectionRow.id.desc()).limit(limit)).all()
    stats = {
        (r.agent_id, r.agent_version, r.signal): r
        for r in s.scalars(select(DetectorSeriesRow).where(DetectorSeriesRow.detection_id.is_not(None)))
    }
    items = []
    for d in rows:
        out = detection_dict(d)
        live = stats.get((d.agent_id, d.agent_version, d.signal))
        if out["active"] and live is not None:
            out["statistic_now"] = max(live.statistics or [0.0])
        items.append(out)
    mark_twins(items, fed_by, _cut_twins(s, q, rows, limit))
    return {"active": [i for i in items if i["active"]], "past": [i for i in items if not i["active"]]}


def _cut_twins(s: Session, q: Select[DetectionRow], rows: Sequence[DetectionRow], limit: int) -> list[Any]:
    """The detections past a full page that started with its last one. Alerts that repeat each other
    started together, and the page is in order of start: only the last start's alerts can be cut in two."""
    if len(rows) < limit:
        return []
    listed = [d.id for d in rows]
    more = q.where(DetectionRow.started_at == rows[-1].started_at, DetectionRow.id.not_in(listed))
    return [detection_dict(d) for d in s.scalars(more)]


@router.get("/v1/alerts", dependencies=[require("reviewer")])
def alerts(
    request: Request,
    active: bool | None = Query(None, description="Only active (true) or only past (false) detections."),
    agent: str | None = None,
    version: str | None = None,
    limit: int = Query(100, ge=1, le=1000),
) -> dict[str, Any]:
    """Regressions the detector raised: ``active`` ones (still held) and ``past`` ones with their end. Every
    detection is listed; one that repeats another (an aggregate's alert raised with the same conversations
    as a rule's that feeds it) names it: ``folded_into`` on the aggregate's, ``folds`` on the rule's."""
    rt = runtime_of(request)
    with rt.sessions() as s:
        return list_alerts(s, fed_by_rules(rt.rules), active, agent, version, limit)
