"""``GET /ui/compare``: the compare table in the reviewer UI (template ``compare.html``).

Its handlers are plain ``def`` (run in a worker thread): the compare, its drill-down and the page's
render (the session, the alert banners) all read the database, which must not happen on the event loop.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from vigil.compare import present
from vigil.compare.api import counting, outcomes_before, run_compare
from vigil.compare.drill import PAGE, UnknownSignal, conversations_behind
from vigil.compare.table import CompareError
from vigil.http import runtime_of
from vigil.http.auth import Principal
from vigil.http.params import MAX_OFFSET
from vigil.money import usd
from vigil.store import rollups
from vigil.store.signals import version_key
from vigil.ui.links import anchor, quality_link, queue_label, queue_link, review_link
from vigil.ui.render import render_page, ui_user

router = APIRouter(prefix="/ui", include_in_schema=False)


def versions(rt: Any) -> dict[str, list[str]]:
    """Agent → its versions, newest first: by first conversation stored, then by version order.

    Versions first stored in the same batch (a canary starting with the demo or a replay) tie on
    time; like the detector, ``v1.5.0`` then counts as newer than ``v1.4.0``. Agents come in the
    order of their newest version.
    """
    with counting(rt) as (s, _tail):
        seen = rollups.versions_seen(s)
    seen.sort(key=lambda r: (r[2], version_key(r[1])), reverse=True)
    out: dict[str, list[str]] = {}
    for agent, version, _ in seen:
        out.setdefault(agent, []).append(version)
    return out


@router.get("/compare")
def compare_page(
    request: Request,
    agent: str | None = None,
    baseline: str | None = None,
    candidate: str | None = None,
    user: Principal = Depends(ui_user),
) -> Response:
    rt = runtime_of(request)
    known = versions(rt)
    # the agent whose version is newest among those with two to compare (a benchmark imported as its own
    # agent has one version and shows nothing)
    agent = agent or next((a for a, vs in known.items() if len(vs) >= 2), next(iter(known), None))
    options = known.get(agent or "", [])
    if options and baseline not in options and candidate not in options:
        baseline = candidate = None  # neither side is this agent's: the form kept the previous agent's versions
    if agent and not baseline and not candidate and len(options) >= 2:
        candidate, baseline = options[0], options[1]
    result, error = None, None
    shown: list[dict[str, Any]] = []
    folded: list[dict[str, Any]] = []
    if baseline and candidate:
        try:
            result = run_compare(rt, baseline, candidate, agent)
            shown, folded = present.ordered(result["signals"])
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
        shown=shown,
        folded=folded,
        error=error,
        p=present,
        behind=lambda version, signal: (
            "/ui/compare/conversations?"
            + urlencode({"agent": result["agent_id"] if result else agent, "version": version, "signal": signal})
        ),
    )


def onward(agent: str, version: str, signal: str) -> list[tuple[str, str, str]]:
    """Where the list of a signal's conversations leads on: (id, words, address) of the queue narrowed
    to them, the signal's chart and the version's alerts on it."""
    return [
        ("to-queue", queue_label(signal), queue_link(agent, version, signal)),
        ("to-chart", "Its rate over time", quality_link(agent, version) + "#" + anchor(signal)),
        (
            "to-alerts",
            "Alerts on it",
            "/ui/alerts?" + urlencode({"agent": agent, "version": version, "signal": signal}),
        ),
    ]


def _rule_description(rt: Any, signal: str) -> str | None:
    kind, _, name = signal.partition(":")
    if kind != "rule":
        return None
    return next((r.description or None for r in rt.rules.rules if r.id == name), None)


@router.get("/compare/conversations")
def conversations_page(
    request: Request,
    agent: str,
    version: str,
    signal: str,
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
    user: Principal = Depends(ui_user),
) -> Response:
    rt = runtime_of(request)
    try:
        with rt.sessions() as s:
            found = conversations_behind(
                s,
                agent,
                version,
                signal,
                offset,
                metadata_sample=rt.settings.compare_metadata_sample,
                outcomes_before=outcomes_before(rt),
            )
    except UnknownSignal as exc:
        return render_page(request, "error.html", 404, title="Not found", message=str(exc))

    def page(at: int) -> str:
        return "/ui/compare/conversations?" + urlencode(
            {"agent": agent, "version": version, "signal": signal, "offset": at}
        )

    return render_page(
        request,
        "compare_conversations.html",
        title=f"{version}: conversations {found['what']}",
        found=found,
        usd=usd,
        review=lambda cid: review_link(cid, page(offset)),  # the conversation's crumb leads back here
        onward=onward(agent, version, signal),
        rule_description=_rule_description(rt, signal),
        page=page,
        per_page=PAGE,
    )
