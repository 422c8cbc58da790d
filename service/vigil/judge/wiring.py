"""Wires the judge stage into a runtime: the sampler everywhere, the worker in worker roles."""

from __future__ import annotations

from vigil.judge.api import router
from vigil.judge.client import ClientOverride, LLMClient
from vigil.judge.definitions import load_judges
from vigil.judge.engine import JudgeEngine
from vigil.judge.errors import JudgeDefinitionError
from vigil.judge.models import JudgeRequestRow
from vigil.judge.sampling import JudgeSampler
from vigil.judge.stage import JudgeStage
from vigil.judge.worker import JudgeWorker
from vigil.runtime import JudgeInfo, Runtime
from vigil.store.erasure import deleting

WORKER_ROLES = ("serve", "judge-worker")
ERASE = deleting(JudgeRequestRow.conversation_id)


def wire(rt: Runtime, client: LLMClient | None = None) -> JudgeStage:
    """Sampler on every role that stores conversations; the worker only in ``serve`` and ``judge-worker``.

    Invalid judge definitions raise ConfigError here, at start-up.
    """
    judges = load_judges(rt.settings)
    for judge in judges.values():
        if judge.spec.timeout_seconds + 5 >= rt.settings.judge_lease_seconds:
            raise JudgeDefinitionError(
                f"{judge.path / 'judge.yaml'}: timeout_seconds {judge.spec.timeout_seconds} must be well "
                f"under VIGIL_JUDGE_LEASE_SECONDS ({rt.settings.judge_lease_seconds}): a slow call would "
                "lose its lease"
            )
    override = rt.find(ClientOverride)
    client = client or (override.client if override else None)
    engine = JudgeEngine(rt.settings, judges, rt.metrics, rt.sessions, client)
    sampler = JudgeSampler(
        judges,
        rt.metrics,
        min_versions=rt.settings.judge_min_versions,
        min_per_hour_cap=rt.settings.judge_min_per_hour_cap,
    )
    stage = JudgeStage(engine, sampler)
    if judges:
        rt.hooks.downstream.append(sampler)
        rt.hooks.outcome_listeners.append(sampler.on_outcomes)
    rt.hooks.conversation_enrichers.append(stage.enrich)
    if ERASE not in rt.hooks.erasers:
        rt.hooks.erasers.append(ERASE)
    rt.hooks.add_router(router)
    if judges and rt.has_role(*WORKER_ROLES):
        stage.worker = JudgeWorker(engine, rt.hooks.verdict_listeners, heartbeat=rt.heartbeat("judge"))
        rt.hooks.background.append(stage.worker)
    rt.judges = {
        name: JudgeInfo(name, j.version, engine.lanes[name].model, engine.lanes[name].offline)
        for name, j in judges.items()
        if name in engine.lanes
    }
    rt.provide(stage)
    return stage
