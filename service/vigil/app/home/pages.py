"""``/`` → ``/ui``; ``/ui`` (what is happening now); ``/ui/quality`` (charts); ``/ui/conversations`` (find one).

Their JSON: ``GET /v1/overview``, ``GET /v1/quality/series`` and ``GET /v1/conversations``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import RedirectResponse, Response

from vigil.app.home import browse, charts, now, quality
from vigil.detector.twins import fed_by_rules, fold_twins
from vigil.http import runtime_of
from vigil.http.auth import Principal, require
from vigil.http.params import Given
from vigil.money import usd
from vigil.rules import SEVERITY_RANK
from vigil.ui.forms import go
from vigil.ui.links import (
    anchor,
    baseline_version,
    behind_link,
    compare_link,
    quality_link,
    queue_label,
    queue_link,
    review_link,
)
from vigil.ui.render import render_page, ui_user

root = APIRouter(include_in_schema=False)
router = APIRouter(prefix="/ui", include_in_schema=False)
api = APIRouter(tags=["overview"])


@root.get("/")
def to_console() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=307)


def rate(v: float | None) -> str:
    return "–" if v is None else charts.pct(v)


def interval(e: dict[str, Any]) -> str:
    """``30% [22%, 40%] of 100``: a rate with its interval and count."""
    if e.get("rate") is None:
        return "–"
    return f"{charts.pct(e['rate'])} [{charts.pct(e['low'])}, {charts.pct(e['high'])}] of {e['n']:,}"


@router.get("")
@router.get("/")
def home_page(request: Request, user: Principal = Depends(ui_user)) -> Response:
    rt = runtime_of(request)
    data = now.snapshot(rt)
    data["alerts"] = fold_twins(data["alerts"], fed_by_rules(rt.rules))  # one item, as on /ui/alerts
    return render_page(
        request,
        "home.html",
        title="Now",
        **data,
        queue_link=queue_link,
        queue_label=queue_label,
        behind_link=behind_link,
        quality_link=quality_link,
        rate=rate,
        interval=interval,
        anchor=anchor,
        compare_link=compare_link,
        baseline_version=baseline_version,
    )


def _pick(
    rt: Any, agent: str | None, version: str | None
) -> tuple[dict[str, list[str]], str | None, str | None, str | None]:
    """The agent and version to show (those asked for, if the detector counts them, else the first agent's
    newest version), and a notice when that is not what was asked for (an address kept from before, or
    mistyped, must not show another version's charts as if they were its own)."""
    with rt.sessions() as s:
        known = quality.versions(s)
    picked_agent = agent if agent in known else next(iter(known), None)
    options = known.get(picked_agent or "", [])
    picked = version if version in options else next(iter(options), None)
    notice = None
    if known and agent and agent not in known:
        notice = f"No counts of agent {agent!r}: showing {picked_agent} {picked}."
    elif known and version and version not in options:
        notice = f"No counts of {picked_agent} version {version!r}: showing {picked}."
    return known, picked_agent, picked, notice


@router.get("/quality")
def quality_page(
    request: Request,
    agent: str | None = None,
    version: str | None = None,
    since: str | None = None,
    until: str | None = None,
    last: str | None = None,
    user: Principal = Depends(ui_user),
) -> Response:
    rt = runtime_of(request)
    known, agent, version, notice = _pick(rt, agent, version)
    error, series, preset = None, [], None
    start = end = rt.now()
    try:
        start, end, preset = quality.time_range(since, until, last, end)
    except quality.RangeError as exc:
        error = str(exc)
    if error is None and agent and version:
        series = quality.quality(rt, agent, version, start, end)
    # a signal that never failed in the range and raised nothing is named, not drawn
    drawn = [(s, charts.draw(s.points, s.spans, start, end)) for s in series if s.total["x"] or s.spans]
    quiet = [s for s in series if not (s.total["x"] or s.spans)]
    wider = _wider(agent or "", version or "", start, end, until) if not error else None
    return render_page(
        request,
        "quality.html",
        400 if error else 200,
        title="Quality over time",
        known=known,
        agent=agent,
        version=version,
        since=since or f"{start:%Y-%m-%dT%H:%M}",
        until=until or f"{end:%Y-%m-%dT%H:%M}",
        preset=preset,
        presets=list(quality.RANGES),
        error=error,
        notice=notice,
        charts=drawn,
        quiet=quiet,
        bucket=quality.bucket_for(end - start),
        wider=wider,
        listed="/ui/conversations?" + urlencode({"agent": agent or "", "version": version or ""}),
        queue_link=queue_link,
        queue_label=queue_label,
        quality_link=quality_link,
        rate=rate,
        anchor=anchor,
    )


def _wider(agent: str, version: str, start: datetime, end: datetime, until: str | None) -> tuple[str, str] | None:
    """The next longer range ending where this one does (a preset when it ends now), with its name; None when
    the range is already the longest a chart covers."""
    for name, span in [*quality.RANGES.items(), (f"{quality.MAX_RANGE.days}d", quality.MAX_RANGE)]:
        if span > end - start:
            if end - datetime.min.replace(tzinfo=UTC) < span:
                return None  # a range ending in year 1 has no longer one before it (the subtraction was a 500)
            if not until and name in quality.RANGES:
                return quality_link(agent, version, last=name), name
            return quality_link(
                agent, version, since=f"{end - span:%Y-%m-%dT%H:%M}", until=f"{end:%Y-%m-%dT%H:%M}"
            ), name
    return None


NAMED = 12  # known agents or versions a "no match" names; more are counted


def _names(values: list[str]) -> str:
    more = len(values) - NAMED
    return ", ".join(values[:NAMED]) + (f" and {more} more" if more > 0 else "")


def unknown_filters(filters: browse.Filters, known: dict[str, list[str]]) -> list[str]:
    """Why a list may be empty: an agent or version no conversation is counted under, with the known ones
    (the detector's series, as the fields' suggestions: a typo said only "no stored conversation matches")."""
    out: list[str] = []
    if not known:  # nothing counted yet: nothing to name, and no reason to say a name is wrong
        return out
    if filters.agent and filters.agent not in known:
        out.append(f"No agent {filters.agent!r} is known; agents: {_names(list(known))}.")
    elif filters.version:
        versions = known.get(filters.agent, []) if filters.agent else sorted({v for vs in known.values() for v in vs})
        if filters.version not in versions:
            whose = f"{filters.agent}'s versions" if filters.agent else "versions"
            out.append(f"No version {filters.version!r} is known; {whose}: {_names(versions) or 'none'}.")
    return out


@router.get("/conversations")
def conversations_page(
    request: Request,
    id: str | None = None,
    agent: str | None = None,
    version: str | None = None,
    rule: str | None = None,
    severity: str | None = None,
    since: str | None = None,
    until: str | None = None,
    cursor: str | None = None,
    user: Principal = Depends(ui_user),
) -> Response:
    """Find a conversation by id, or list stored conversations newest first by agent, version, rule,
    severity and time (keyset pages). A plain ``def``: its reads and its render (the banners read the
    database too) run in a worker thread, off the event loop."""
    rt = runtime_of(request)
    wanted = (id or "").strip()
    error, missing, found, filters = None, None, None, browse.Filters()
    try:
        filters = browse.Filters.read(agent, version, rule, severity, since, until)
    except browse.FindError as exc:
        error = str(exc)

    def run() -> tuple[bool, dict[str, Any] | None, dict[str, list[str]]]:
        with rt.sessions() as s:
            hit = bool(wanted) and browse.exists(s, wanted)
            listed = None
            if not hit and error is None:
                listed = browse.page(s, filters, cursor, rt.settings.list_count_cap)
            return hit, listed, quality.versions(s)

    try:
        hit, found, known = run()
    except browse.FindError as exc:  # a cursor this Vigil did not hand out
        error, hit, known = str(exc), False, {}
    if hit:
        return go("/ui/review/" + quote(wanted, safe=""))
    if wanted:
        missing = f"No conversation has the id {wanted!r}."
    here = "/ui/conversations" + (f"?{request.url.query}" if request.url.query else "")
    return render_page(
        request,
        "conversations.html",
        400 if error else 200,
        title="Conversations",
        found=found,
        filters=filters,
        wanted=wanted,
        error=error,
        missing=missing,  # not ``notice``: the base template would say it a second time atop the page
        known=known,
        rules=sorted({r.id for r in rt.rules.rules} | ({filters.rule} if filters.rule else set())),
        severities=list(SEVERITY_RANK),
        usd=usd,
        review=lambda cid: review_link(cid, here),
        unknown=unknown_filters(filters, known),
        older=lambda c: "/ui/conversations?" + urlencode({**filters.given, "cursor": c}),
        newest="/ui/conversations?" + urlencode(filters.given),
    )


@api.get("/v1/overview", dependencies=[require("reviewer")])
def overview(request: Request) -> dict[str, Any]:
    """What the console's home page shows: active alerts, traffic and flag rate per version, queue, judge spend."""
    return now.as_json(now.snapshot(runtime_of(request)))


@api.get("/v1/quality/series", dependencies=[require("reviewer")])
def quality_series(
    request: Request,
    agent: Given,
    version: Given,
    since: str | None = Query(None, description="ISO time; default 7 days before until"),
    until: str | None = Query(None, description="ISO time; default now"),
) -> dict[str, Any]:
    """Every quality signal of one agent version over time, per bucket, with 95% Wilson intervals and alerts."""
    try:
        start, end, _ = quality.time_range(since, until, None, runtime_of(request).now())
    except quality.RangeError as exc:
        raise HTTPException(422, str(exc)) from exc
    series = quality.quality(runtime_of(request), agent, version, start, end)
    return {
        "agent_id": agent,
        "agent_version": version,
        "since": start,
        "until": end,
        "bucket_hours": quality.bucket_for(end - start).total_seconds() / 3600,
        "series": quality.as_json(series),
    }
