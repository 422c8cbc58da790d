"""``GET /v1/rules/quality``: each pack's and rule's power to find failures on stored traffic."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from starlette.concurrency import run_in_threadpool

from vigil.evaluation import quality, sources
from vigil.http import runtime_of
from vigil.http.auth import require
from vigil.http.params import Instant
from vigil.review import FlaggingPolicy
from vigil.runtime import Runtime

router = APIRouter(tags=["rules"])


def rule_quality(
    rt: Runtime,
    outcome: str,
    polarity: sources.Polarity = "auto",
    since: datetime | None = None,
    agent: str | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    policy = FlaggingPolicy.load(rt.settings.review_policy or None)
    judge = sources.Judge(outcome, polarity, policy)
    with rt.sessions() as session:
        obs, left_out = sources.from_store(session, rt.rules, policy, judge, since, agent, version)
    threshold = sources.review_threshold(policy)
    return quality.evaluate(obs, sources.rule_infos(rt.rules), outcome, threshold, left_out).as_dict()


@router.get("/v1/rules/quality", dependencies=[require("reviewer")])
async def get_rule_quality(
    request: Request,
    outcome: str = Query("task_success", description="The outcome that says whether a conversation went well."),
    polarity: sources.Polarity = Query("auto", description="good: failure below the bar; bad: failure if it happened."),
    since: Instant | None = Query(None, description="Traffic received since; default: the last 30 days."),
    agent: str | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """Firing rate, precision, recall and lift (95% intervals) per pack, severity and rule."""
    rt = runtime_of(request)
    window = since or rt.now() - timedelta(days=30)
    result = await run_in_threadpool(rule_quality, rt, outcome, polarity, window, agent, version)
    if not result["conversations"]:
        scope = sources.stored_scope(agent, version, window)
        raise HTTPException(404, f"no stored conversation{scope} has the outcome {outcome!r}")
    return result
