"""Judge endpoints: judges and their state, verdicts, manual requests, resume, pairwise comparisons."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vigil.http import runtime_of
from vigil.http.auth import require
from vigil.http.params import MAX_OFFSET
from vigil.judge import store
from vigil.judge.engine import JudgeEngine, JudgeUnavailable, is_offline_detail
from vigil.judge.errors import ProviderError
from vigil.judge.offline import OFFLINE_LABEL
from vigil.judge.pairwise import compare, pairwise_dict
from vigil.judge.stage import JudgeStage, verdict_dict
from vigil.store.db import aware
from vigil.store.models import PairwiseRow, VerdictRow

router = APIRouter(tags=["judge"])


def _stage(request: Request) -> JudgeStage:
    return runtime_of(request).get(JudgeStage)


def _engine(request: Request, name: str) -> JudgeEngine:
    engine = _stage(request).engine
    if name not in engine.lanes:
        raise HTTPException(404, f"no judge {name!r}; judges: {sorted(engine.lanes)}")
    return engine


def judge_info(stage: JudgeStage, session: Session, names: list[str]) -> list[dict[str, Any]]:
    eng = stage.engine
    depth = store.queue_depth(session)
    spent = store.spend_since(session, eng.day_start(eng.now(session)))
    statuses = store.load_status(session, names)
    out = []
    for name in names:
        lane = eng.lanes[name]
        j, sp = lane.judge, lane.judge.spec
        since: datetime | None
        worker: str | None
        offline = lane.offline
        if stage.worker is not None:
            state, detail, since, worker = lane.state, lane.detail, lane.changed_at, stage.worker.owner
        elif name in statuses and statuses[name].state != "resume_requested":
            row = statuses[name]
            state, detail, since, worker = row.state, row.detail, row.updated_at, row.worker
            offline = is_offline_detail(detail)  # the worker's mode, which may differ from this process's
        else:
            state, detail, since, worker = "no_worker", "no judge worker has reported yet", None, None
        out.append(
            {
                "name": name,
                "version": j.version,
                "description": sp.description,
                "model": sp.model,
                "mode": "offline" if offline else "live",
                "judge_label": OFFLINE_LABEL if offline else sp.model,
                "state": state,
                "state_detail": detail,
                "state_since": aware(since),  # a stored state comes back naive from SQLite
                "worker": worker,
                "sample_rate": sp.sampling.rate,
                "salt": j.salt,
                "always_judge_severity": sp.sampling.always_judge_severity,
                "negative_outcomes": sp.sampling.negative_outcomes.model_dump()
                if sp.sampling.negative_outcomes
                else None,
                "min_per_agent_version_per_hour": sp.sampling.min_per_agent_version_per_hour,
                "applies_to": sp.applies_to.model_dump(),
                "categories": sp.categories,
                "rpm": sp.limits.rpm,
                "concurrency": sp.limits.concurrency,
                "budget_usd": j.daily_budget_usd,
                "price_source": None if offline else lane.price_source,
                "spent_today_usd": round(spent.get(name, (0.0, 0))[0], 6),
                "queue_depth": depth.get(name, 0),
                "prompt_hash": j.prompt_hash,
            }
        )
    return out


@router.get("/v1/judges", dependencies=[require("reviewer")])
def list_judges(request: Request) -> list[dict[str, Any]]:
    """Judges with sample rate, budget and spend today, queue depth and state."""
    stage = _stage(request)
    with runtime_of(request).sessions() as s:
        return _enriched(request, s, judge_info(stage, s, sorted(stage.engine.lanes)))


@router.get("/v1/judges/{name}", dependencies=[require("reviewer")])
def get_judge(request: Request, name: str) -> dict[str, Any]:
    _engine(request, name)
    with runtime_of(request).sessions() as s:
        return _enriched(request, s, judge_info(_stage(request), s, [name]))[0]


def _enriched(request: Request, session: Session, infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Other stages add to each judge's entry (calibration adds its calibrated state)."""
    for enrich in runtime_of(request).hooks.judge_info_enrichers:
        enrich(session, infos)
    return infos


@router.post("/v1/judges/{name}/resume", dependencies=[require("admin")])
def resume_judge(request: Request, name: str) -> dict[str, Any]:
    """Resume a judge stopped by a configuration error (after fixing the key or model)."""
    eng = _engine(request, name)
    with runtime_of(request).sessions.begin() as s:
        store.request_resume(s, name, eng.now(s))
    stage = _stage(request)
    if stage.worker is not None and eng.lanes[name].state == "stopped_config_error":
        eng.resume(eng.lanes[name])
    return {"judge": name, "resume_requested": True}


class ManualRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422, not silently dropped
    conversation_id: str = Field(min_length=1, max_length=256)


@router.post("/v1/judges/{name}/requests", status_code=202, dependencies=[require("admin")])
def request_judgement(request: Request, name: str, body: ManualRequest) -> dict[str, Any]:
    """Queue a judgement of a stored conversation now (outside the sample)."""
    eng = _engine(request, name)
    stage = _stage(request)
    with runtime_of(request).sessions.begin() as s:
        try:
            row = stage.sampler.enqueue_manual(s, eng.judges[name], body.conversation_id)
        except LookupError:
            raise HTTPException(404, f"no conversation {body.conversation_id!r}") from None
    return {
        "judge": name,
        "conversation_id": body.conversation_id,
        "queued": row is not None,
        "detail": None if row else "this revision is already queued or judged by this judge",
    }


class PairwiseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422, not silently dropped
    input: str = Field(min_length=1, max_length=200_000, description="The shared input (question, context).")
    answer_a: str = Field(max_length=200_000)
    answer_b: str = Field(max_length=200_000)
    label_a: str | None = Field(default=None, max_length=256, description="e.g. the agent version of A.")
    label_b: str | None = Field(default=None, max_length=256)


@router.post("/v1/judges/{name}/pairwise", dependencies=[require("reviewer")])
async def pairwise(request: Request, name: str, body: PairwiseBody) -> dict[str, Any]:
    """Compare two answers in both orders; disagreement between orders is reported as position bias."""
    eng = _engine(request, name)
    try:
        return await compare(eng, name, body.input, body.answer_a, body.answer_b, body.label_a, body.label_b)
    except JudgeUnavailable as exc:
        if exc.state not in ("paused_budget", "circuit_open"):  # stopped: an operator must act first
            raise HTTPException(409, str(exc)) from None
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))} if exc.retry_after else None
        raise HTTPException(503, f"{exc}; try again later", headers=headers) from None
    except ProviderError as exc:
        raise HTTPException(502 if exc.kind == "retryable" else 409, str(exc)) from None


@router.get("/v1/judges/{name}/pairwise", dependencies=[require("reviewer")])
def list_pairwise(request: Request, name: str, limit: int = Query(50, ge=1, le=500)) -> dict[str, Any]:
    _engine(request, name)
    with runtime_of(request).sessions() as s:
        rows = s.scalars(
            select(PairwiseRow).where(PairwiseRow.judge == name).order_by(PairwiseRow.id.desc()).limit(limit)
        ).all()
        total = s.scalar(select(func.count()).select_from(PairwiseRow).where(PairwiseRow.judge == name)) or 0
        biased = (
            s.scalar(
                select(func.count())
                .select_from(PairwiseRow)
                .where(PairwiseRow.judge == name, PairwiseRow.position_bias.is_(True))
            )
            or 0
        )
        return {"total": total, "position_bias": biased, "items": [pairwise_dict(r) for r in rows]}


@router.get("/v1/verdicts", dependencies=[require("reviewer")])
def list_verdicts(
    request: Request,
    judge: str | None = None,
    verdict: Literal["pass", "fail", "unscored"] | None = None,
    agent: str | None = None,
    version: str | None = None,
    offline: bool | None = Query(None, description="true: only the offline judge's; false: only a model's."),
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
) -> dict[str, Any]:
    q = select(VerdictRow)
    for col, value in (
        (VerdictRow.judge, judge),
        (VerdictRow.verdict, verdict),
        (VerdictRow.agent_id, agent),
        (VerdictRow.agent_version, version),
        (VerdictRow.offline, offline),
    ):
        if value is not None:
            q = q.where(col == value)
    with runtime_of(request).sessions() as s:
        total = s.scalar(select(func.count()).select_from(q.subquery())) or 0
        rows = s.scalars(q.order_by(VerdictRow.id.desc()).limit(limit).offset(offset)).all()
        return {"total": total, "items": [verdict_dict(v) for v in rows], "limit": limit, "offset": offset}
