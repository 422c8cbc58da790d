"""Wires the judge stage into a runtime (listed in ``service.wiring.STAGES``)."""

from __future__ import annotations

from ..runtime import Runtime
from .client import LLMClient
from .definitions import load_judges
from .engine import JudgeEngine
from .errors import JudgeDefinitionError
from .sampling import JudgeSampler
from .stage import JudgeStage
from .worker import JudgeWorker

WORKER_ROLES = {"serve", "judge-worker"}


def wire(rt: Runtime, client: LLMClient | None = None) -> JudgeStage:
    """Sampler on every role that stores conversations; the worker only in ``serve`` and ``judge-worker``.

    Sets ``rt.extras["judge"]`` (a :class:`JudgeStage`). Invalid judge definitions raise ConfigError here,
    at start-up.
    """
    from .api import router

    judges = load_judges(rt.settings)
    for judge in judges.values():
        if judge.spec.timeout_seconds + 5 >= rt.settings.judge_lease_seconds:
            raise JudgeDefinitionError(
                f"{judge.path / 'judge.yaml'}: timeout_seconds {judge.spec.timeout_seconds} must be well "
                f"under VIGIL_JUDGE_LEASE_SECONDS ({rt.settings.judge_lease_seconds}): a slow call would "
                "lose its lease"
            )
    client = client or rt.extras.get("judge_client")  # tests put a scripted client here
    engine = JudgeEngine(rt.settings, judges, rt.metrics, rt.sessions, client)
    sampler = JudgeSampler(judges, rt.metrics)
    stage = JudgeStage(engine, sampler)
    if judges:
        rt.pipeline.downstream.append(sampler)
        rt.extras.setdefault("outcome_listeners", []).append(sampler.on_outcomes)
    rt.extras.setdefault("conversation_enrichers", []).append(stage.enrich)
    rt.extras.setdefault("routers", []).append(router)
    roles = rt.extras.get("roles") or {"serve"}
    if judges and roles & WORKER_ROLES:
        stage.worker = JudgeWorker(engine, rt.extras.setdefault("verdict_listeners", []))
        rt.extras.setdefault("background", []).append(stage.worker)
    rt.extras["judge"] = stage
    return stage
