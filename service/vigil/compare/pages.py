"""``GET /ui/compare``: the compare table in the reviewer UI (template ``compare.html``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from vigil.compare.api import catch_up, run_compare
from vigil.compare.table import CompareError
from vigil.http import runtime_of
from vigil.http.auth import Principal
from vigil.store import rollups
from vigil.store.signals import version_key
from vigil.ui.render import render_page, ui_user

router = APIRouter(prefix="/ui", include_in_schema=False)


def versions(rt: Any) -> dict[str, list[str]]:
    """Agent → its versions, newest first: by first conversation stored, then by version order.

    Versions first stored in the same batch (a canary starting with the demo or a replay) tie on
    time; like the detector, ``v1.5.0`` then counts as newer than ``v1.4.0``. Agents come in the
    order of their newest version.
    """
    catch_up(rt)
    with rt.sessions() as s:
        seen = rollups.versions_seen(s)
    seen.sort(key=lambda r: (r[2], version_key(r[1])), reverse=True)
    out: dict[str, list[str]] = {}
    for agent, version, _ in seen:
        out.setdefault(agent, []).append(version)
    return out


def fmt(estimate: dict[str, Any], kind: str) -> str:
    v = estimate.get("value")
    if v is None:
        return "–"
    return f"{100 * v:.2f}%" if kind == "rate" else f"{v:,.4g}"


def interval(estimate: dict[str, Any], kind: str) -> str:
    lo, hi = estimate.get("low"), estimate.get("high")
    if lo is None or hi is None:
        return ""
    if kind == "rate":
        return f"[{100 * lo:.2f}, {100 * hi:.2f}]"
    return f"[{lo:,.4g}, {hi:,.4g}]"


@router.get("/compare")
async def compare_page(
    request: Request,
    agent: str | None = None,
    baseline: str | None = None,
    candidate: str | None = None,
    user: Principal = Depends(ui_user),
) -> Response:
    rt = runtime_of(request)
    known = await run_in_threadpool(versions, rt)
    agent = agent or next(iter(known), None)  # the agent whose version is newest
    options = known.get(agent or "", [])
    if agent and not baseline and not candidate and len(options) >= 2:
        candidate, baseline = options[0], options[1]
    result, error = None, None
    if baseline and candidate:
        try:
            result = await run_in_threadpool(run_compare, rt, baseline, candidate, agent)
        except CompareError as exc:
            error = str(exc)
    return render_page(
        request,
        "compare.html",
        title="Compare versions",
        known=known,
        agent=agent,
        baseline=baseline,
        candidate=candidate,
        result=result,
        error=error,
        fmt=fmt,
        interval=interval,
    )
