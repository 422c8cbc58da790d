"""``GET /v1/compare`` (baseline vs candidate) and ``GET /v1/quality`` (one version's signals)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from vigil.compare.drill import UnknownSignal, conversations_behind
from vigil.compare.pairing import RuleVersions
from vigil.compare.present import headline
from vigil.compare.table import CompareError, RulesFor, SameVersion, compare, quality
from vigil.http import runtime_of
from vigil.http.auth import require
from vigil.http.fastjson import FastJSON
from vigil.http.params import MAX_OFFSET, Given, Instant
from vigil.runtime import Runtime
from vigil.schema import outcome_types
from vigil.store import retention, rollup_tail
from vigil.store.db import clock
from vigil.store.maintenance import Maintenance
from vigil.store.rollups import default_since

router = APIRouter(tags=["compare"])


def applicable_rules(rt: Runtime) -> RulesFor:
    """Ids of the loaded rules whose ``applies_to`` matches an agent and version."""
    return lambda agent, version: [r.id for r in rt.rules.rules_for(agent, version)]


@contextmanager
def counting(rt: Runtime) -> Iterator[tuple[Session, rollup_tail.Tail]]:
    """A session whose rollup reads also count what was written since the rollup job's last run (a bounded
    tail; the job itself is serve's and the detector's, never a request's), and that tail."""
    with rt.sessions() as session:
        tail = rollup_tail.attach(
            session, rt.settings.rollup_read_tail_rows, retention.frozen_before(rt.settings, clock(session))
        )
        upkeep = rt.find(Maintenance)
        if upkeep is not None and (tail.rows or not tail.current):
            upkeep.wake()  # this process runs the job: have it catch up now, for the next read's sake
        yield session, tail


def window(rt: Runtime, since: datetime | None, until: datetime | None) -> tuple[datetime | None, datetime | None]:
    """The read window: as asked, else the last ``read_window_days``."""
    if since is None and until is None:
        since = default_since(rt.settings.read_window_days, rt.now())
    return since, until


def outcomes_before(rt: Runtime) -> datetime | None:
    """Outcome rates count conversations received before this (``VIGIL_COMPARE_OUTCOME_SETTLE_HOURS`` ago, on the
    database's clock, which stamps ``received_at``)."""
    hours = rt.settings.compare_outcome_settle_hours
    return rt.now() - timedelta(hours=hours) if hours > 0 else None


def ordered(since: datetime | None, until: datetime | None) -> None:
    """422 for a window that ends before it starts (it read as "no conversations", a 404 that misleads)."""
    if since is not None and until is not None and since >= until:
        raise HTTPException(422, f"since ({since.isoformat()}) must be before until ({until.isoformat()})")


def rule_versions(rt: Runtime) -> RuleVersions:
    """Each applicable rule's definition (pack, type, digest of severity and arguments): what its row measures."""

    def versions(agent: str, version: str) -> dict[str, str]:
        out = {}
        for r in rt.rules.rules_for(agent, version):
            spec = f"{r.spec.severity}\x1f{r.args.model_dump_json()}"
            out[r.id] = f"{r.pack}/{r.type.name}/{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
        return out

    return versions


def run_compare(
    rt: Runtime,
    baseline: str,
    candidate: str,
    agent: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    per_task: bool = False,
) -> dict[str, Any]:
    s = rt.settings
    since, until = window(rt, since, until)
    with counting(rt) as (session, tail):
        result = compare(
            session,
            baseline,
            candidate,
            outcome_types(rt.settings.outcome_types),
            applicable_rules(rt),
            agent,
            s.compare_max_sample,
            s.compare_bootstrap_resamples,
            since,
            until,
            s.compare_metadata_sample,
            rule_versions(rt),
            per_task,
            outcomes_before(rt),
        )
        for enrich in rt.hooks.compare_enrichers:  # calibration adds corrected judge rates
            enrich(session, result)
        result["headline"] = headline(result)
        result["counts"] = tail.freshness()
        return result


@router.get("/v1/compare", dependencies=[require("reviewer")], response_class=FastJSON)
async def get_compare(
    request: Request,
    baseline: Annotated[Given, Query(description="Baseline agent version.")],
    candidate: Annotated[Given, Query(description="Candidate agent version.")],
    agent: str | None = Query(None, description="Agent id; needed when both versions exist for several agents."),
    since: Instant | None = Query(None, description="Window start (default: read_window_days ago)."),
    until: Instant | None = Query(None, description="Window end (default: now)."),
    per_task: bool = Query(False, description="Also list each task's pass@k and pass^k (thousands of rows at volume)."),
) -> FastJSON:
    """Each signal for both versions with 95% intervals, the difference, a verdict and red flags."""
    ordered(since, until)
    try:
        return FastJSON(
            await run_in_threadpool(
                run_compare, runtime_of(request), baseline, candidate, agent, since, until, per_task
            )
        )
    except SameVersion as exc:  # a refused parameter, like the API's other 422s
        raise HTTPException(422, str(exc)) from None
    except CompareError as exc:
        raise HTTPException(404, str(exc)) from None


@router.get("/v1/compare/conversations", dependencies=[require("reviewer")])
async def get_conversations_behind(
    request: Request,
    agent: Given,
    version: Given,
    signal: Annotated[
        Given, Query(description="A signal of the compare table, e.g. rule:<id>, judge:<name>, tasks:success.")
    ],
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
    since: Instant | None = None,
    until: Instant | None = None,
) -> dict[str, Any]:
    """The conversations of one version behind one row of the compare table, a page at a time."""
    ordered(since, until)
    rt = runtime_of(request)

    def run() -> dict[str, Any]:
        with rt.sessions() as s:
            return conversations_behind(
                s,
                agent,
                version,
                signal,
                offset,
                since,
                until,
                rt.settings.compare_metadata_sample,
                outcomes_before(rt),
            )

    try:
        return await run_in_threadpool(run)
    except UnknownSignal as exc:
        raise HTTPException(404, str(exc)) from None


@router.get("/v1/quality", dependencies=[require("reviewer")], response_class=FastJSON)
async def get_quality(
    request: Request,
    agent: Given,
    version: Given,
    since: Instant | None = Query(None, description="Window start (default: read_window_days ago)."),
    until: Instant | None = Query(None, description="Window end (default: now)."),
    per_task: bool = Query(False, description="Also list each task's pass@k and pass^k (thousands of rows at volume)."),
) -> FastJSON:
    """Quality signals of one agent version with 95% intervals."""
    ordered(since, until)
    rt = runtime_of(request)

    def run() -> dict[str, Any]:
        start, end = window(rt, since, until)
        with counting(rt) as (session, tail):
            found = quality(
                session,
                agent,
                version,
                outcome_types(rt.settings.outcome_types),
                applicable_rules(rt),
                rt.settings.compare_max_sample,
                rt.settings.compare_bootstrap_resamples,
                start,
                end,
                per_task,
                outcomes_before(rt),
            )
            found["counts"] = tail.freshness()
            return found

    found = await run_in_threadpool(run)
    if not found["conversations"]:
        raise HTTPException(404, f"agent {agent!r} has no finished conversations of version {version!r}")
    return FastJSON(found)
