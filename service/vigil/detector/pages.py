"""``/ui/alerts``: the detector's detections with their evidence, and the banner every UI page shows for them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from vigil.detector.api import list_alerts
from vigil.detector.hourly import series_totals
from vigil.detector.models import DetectionRow, QualityCountRow
from vigil.detector.twins import fed_by_rules, fold_twins, kin
from vigil.http import runtime_of
from vigil.http.auth import Principal
from vigil.store.db import aware
from vigil.ui.links import anchor, baseline_version, behind_link, compare_link, quality_link, queue_label, queue_link
from vigil.ui.render import render_page, ui_user

router = APIRouter(prefix="/ui", include_in_schema=False)

BANNER_ALERTS = 3
BANNER_SCAN = 50  # active alerts read to fold twins before the newest BANNER_ALERTS are shown
EVIDENCE_HOURS = 12
CHART_LEAD = timedelta(hours=2)  # a card's chart starts this long before the version's first counted hour shown
CHART_TAIL = timedelta(hours=2)  # and an ended alert's runs this long past its end
CHART_MAX = timedelta(days=92)  # the quality page's longest range


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


def chart_range(alert: dict[str, Any], now: datetime) -> dict[str, str]:
    """The quality page's ``since`` (and ``until``, for an ended alert) that frame an alert: from shortly before
    the earliest hour its evidence holds (the version's first traffic, for a canary out an hour ago; else
    the hours before the start) to now, or shortly after its end. The default week drew a new version's
    regression as a dot at the right edge."""
    start = aware(alert["started_at"])
    hours = [h["hour"] for h in (alert.get("evidence") or {}).get("hours") or []]
    since = min([start.replace(minute=0, second=0, microsecond=0), *hours]) - CHART_LEAD
    end = aware(alert["ended_at"]) + CHART_TAIL if alert.get("ended_at") else None
    if end is not None and end >= now:
        end = None  # ended within the tail: up to now
    if (end or now) - since > CHART_MAX:  # an alert older than the longest chart: its last CHART_MAX
        since = (end or now) - CHART_MAX
    out = {"since": f"{since:%Y-%m-%dT%H:%M}"}
    if end is not None:
        out["until"] = f"{end:%Y-%m-%dT%H:%M}"
    return out


def links(alert: dict[str, Any], now: datetime) -> dict[str, str]:
    """Where an alert's page leads; ``now`` (the database's clock, which dates the alert) ends the chart's range."""
    agent, version, signal = alert["agent_id"], alert["agent_version"], alert["signal"]
    out = {
        "queue": queue_link(agent, version, signal),
        "queue_label": queue_label(signal),
        "behind": behind_link(agent, version, signal),
        "chart": quality_link(agent, version, **chart_range(alert, now)),
    }
    base = baseline_version(alert["baseline"])
    if base:
        out["compare"] = compare_link(agent, base, version)
    return out


def _matches(alert: dict[str, Any], signal: str | None) -> bool:
    """Whether a card is the one a link naming ``signal`` means: its own signal, or one folded into it
    (``forbidden_tool`` raised with the rule that fed it is shown on the rule's card)."""
    return not signal or alert["signal"] == signal or any(t["signal"] == signal for t in alert.get("twins") or [])


@router.get("/alerts")
def alerts_page(
    request: Request,
    show: str = "active",
    agent: str | None = None,
    version: str | None = None,
    signal: str | None = None,
    user: Principal = Depends(ui_user),
) -> Response:
    """``agent``, ``version`` and ``signal`` (an alert rule's labels ``agent``, ``agent_version`` and
    ``signal``) narrow the page to one regression; narrowed, it lists the ended alerts too, since a link
    from a notification may be followed after its detection ended."""
    rt = runtime_of(request)
    fed_by = fed_by_rules(rt.rules)
    agent, version, signal = agent or None, version or None, signal or None
    narrowed = {k: v for k, v in (("agent", agent), ("version", version), ("signal", signal)) if v}
    if narrowed:
        show = "all"
    with rt.sessions() as s:
        # the signal's own and its twins' only: filtered after a page of every signal's, an alert behind 100
        # newer ones of other signals was missing from the page its notification links to
        signals = kin(signal, fed_by) if signal else None
        data = list_alerts(s, fed_by, agent=agent, version=version, limit=100, signals=signals)
        active = [a for a in fold_twins(data["active"], fed_by) if _matches(a, signal)]
        past = [a for a in fold_twins(data["past"], fed_by) if _matches(a, signal)][:50] if show == "all" else []
        now = rt.now()
        for a in active + past:
            a["evidence"] = evidence(s, a)
            a["links"] = links(a, now)
    return render_page(
        request,
        "alerts.html",
        title="Alerts",
        active=active,
        past=past,
        past_count=len(data["past"]),
        show=show,
        narrowed=narrowed,
        anchor=anchor,
    )


@dataclass(frozen=True)
class AlertBanner:
    """The banners of active detections (the newest few, the rest as a count): a ``rt.hooks.banners`` source."""

    sessions: sessionmaker[Session]
    fed_by: tuple[tuple[str, frozenset[str]], ...] = ()  # fed_by_rules' items (hashable): see fold_twins

    def __call__(self) -> list[dict[str, str]]:
        d = DetectionRow
        with self.sessions() as s:
            rows = s.execute(
                select(
                    d.id,
                    d.signal,
                    d.agent_id,
                    d.agent_version,
                    d.started_at,
                    d.rate.label("rate_at_start"),
                    d.observations.label("observations_at_start"),
                )
                .where(d.ended_at.is_(None))
                .order_by(d.started_at.desc(), d.id.desc())
                .limit(BANNER_SCAN)
            ).all()
            total = len(rows)
            if total == BANNER_SCAN:
                total = s.scalar(select(func.count()).select_from(d).where(d.ended_at.is_(None))) or total
        alerts = fold_twins([{**r._asdict(), "active": True} for r in rows], dict(self.fed_by))
        total -= len(rows) - len(alerts)  # twins folded among the ones read: one regression, one line
        out = [
            {
                "text": f"Alert: {a['signal']} is worse on {a['agent_id']} {a['agent_version']} "
                f"since {aware(a['started_at']):%Y-%m-%d %H:%M} UTC",
                "href": f"/ui/alerts#alert-{a['id']}",
            }
            for a in alerts[:BANNER_ALERTS]
        ]
        if total > len(out):
            out.append({"text": f"and {total - len(out)} more active alerts", "href": "/ui/alerts"})
        return out
