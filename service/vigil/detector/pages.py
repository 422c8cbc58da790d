"""``/ui/alerts``: the detector's detections with their evidence, and the banner every UI page shows for them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from vigil.detector.api import list_alerts
from vigil.detector.hourly import series_totals
from vigil.detector.models import DetectionRow, QualityCountRow
from vigil.http import runtime_of
from vigil.http.auth import Principal
from vigil.store.db import aware
from vigil.ui.links import anchor, baseline_version, behind_link, compare_link, quality_link, queue_link
from vigil.ui.render import render_page, ui_user

router = APIRouter(prefix="/ui", include_in_schema=False)

BANNER_ALERTS = 3
EVIDENCE_HOURS = 12


def wilson(x: int, n: int) -> dict[str, Any]:
    """``x / n`` with its 95% Wilson interval (all None when ``n`` is 0)."""
    if n <= 0:
        return {"rate": None, "low": None, "high": None, "x": x, "n": 0}
    x = min(max(x, 0), n)
    from statsmodels.stats.proportion import proportion_confint  # a second to import: when drawn

    low, high = proportion_confint(x, n, alpha=0.05, method="wilson")
    return {"rate": x / n, "low": float(low), "high": float(high), "x": x, "n": n}


def evidence(s: Session, alert: dict[str, Any]) -> dict[str, Any]:
    """What the detector saw: rates with intervals (when raised, now, baseline) and the hours around the start."""
    agent, version, signal = alert["agent_id"], alert["agent_version"], alert["signal"]
    n0 = int(alert["observations_at_start"] or 0)
    at_start = wilson(round(alert["rate_at_start"] * n0), n0)
    base = baseline_version(alert["baseline"])
    baseline = wilson(*reversed(series_totals(s, agent, base, signal))) if base else None
    now = wilson(*reversed(series_totals(s, agent, version, signal)))
    start = aware(alert["started_at"]).replace(minute=0, second=0, microsecond=0)
    rows = s.execute(
        select(QualityCountRow.hour, QualityCountRow.n, QualityCountRow.x)
        .where(
            QualityCountRow.agent_id == agent,
            QualityCountRow.agent_version == version,
            QualityCountRow.signal == signal,
            QualityCountRow.hour >= start - timedelta(hours=EVIDENCE_HOURS - 2),
            QualityCountRow.hour <= start + timedelta(hours=1),
        )
        .order_by(QualityCountRow.hour)
    ).all()
    hours = [{"hour": aware(h), **wilson(int(x), int(n)), "alarm": aware(h) == start} for h, n, x in rows]
    return {"at_start": at_start, "baseline": baseline, "now": now, "hours": hours}


def links(alert: dict[str, Any]) -> dict[str, str]:
    agent, version, signal = alert["agent_id"], alert["agent_version"], alert["signal"]
    out = {
        "queue": queue_link(agent, version, signal),
        "behind": behind_link(agent, version, signal),
        "chart": quality_link(agent, version),
    }
    base = baseline_version(alert["baseline"])
    if base:
        out["compare"] = compare_link(agent, base, version)
    return out


@router.get("/alerts")
def alerts_page(request: Request, show: str = "active", user: Principal = Depends(ui_user)) -> Response:
    with runtime_of(request).sessions() as s:
        data = list_alerts(s, limit=100)
        shown = data["active"] + (data["past"][:50] if show == "all" else [])
        for a in shown:
            a["evidence"], a["links"] = evidence(s, a), links(a)
    return render_page(
        request,
        "alerts.html",
        title="Alerts",
        active=data["active"],
        past=data["past"][:50] if show == "all" else [],
        past_count=len(data["past"]),
        show=show,
        anchor=anchor,
    )


@dataclass(frozen=True)
class AlertBanner:
    """The banners of active detections (the newest few, the rest as a count): a ``rt.hooks.banners`` source."""

    sessions: sessionmaker[Session]

    def __call__(self) -> list[dict[str, str]]:
        with self.sessions() as s:
            active = s.scalars(
                select(DetectionRow)
                .where(DetectionRow.ended_at.is_(None))
                .order_by(DetectionRow.started_at.desc(), DetectionRow.id.desc())
                .limit(BANNER_ALERTS)
            ).all()
            total = len(active)
            if total == BANNER_ALERTS:
                where = DetectionRow.ended_at.is_(None)
                total = s.scalar(select(func.count()).select_from(DetectionRow).where(where)) or total
        out = [
            {
                "text": f"Alert: {d.signal} is worse on {d.agent_id} {d.agent_version} "
                f"since {aware(d.started_at):%Y-%m-%d %H:%M} UTC",
                "href": f"/ui/alerts#alert-{d.id}",
            }
            for d in active
        ]
        if total > len(active):
            out.append({"text": f"and {total - len(active)} more active alerts", "href": "/ui/alerts"})
        return out
