"""The judge stage's parts in one process: definitions, engine, sampler and (in worker roles) the worker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from vigil.judge.engine import JudgeEngine
from vigil.judge.offline import OFFLINE_LABEL
from vigil.judge.sampling import JudgeSampler
from vigil.judge.store import verdicts_for
from vigil.judge.worker import JudgeWorker
from vigil.store.db import aware
from vigil.store.models import VerdictRow


@dataclass
class JudgeStage:
    engine: JudgeEngine
    sampler: JudgeSampler
    worker: JudgeWorker | None = None

    def enrich(self, session: Session, conversation: dict[str, Any]) -> None:
        """``conversation_enrichers`` entry: adds ``verdicts`` to ``GET /v1/conversations/{id}``."""
        conversation["verdicts"] = [verdict_dict(v) for v in verdicts_for(session, conversation["conversation_id"])]


def verdict_dict(v: VerdictRow) -> dict[str, Any]:
    return {
        "id": v.id,
        "judge": v.judge,
        "judge_version": v.judge_version,
        "conversation_id": v.conversation_id,
        "revision": v.revision,
        "agent_id": v.agent_id,
        "agent_version": v.agent_version,
        "verdict": v.verdict,
        "score": v.score,
        "categories": v.categories,
        "rationale": v.rationale,
        "unscored_reason": v.unscored_reason,
        "model": v.model,
        "offline": v.offline,
        "judge_label": OFFLINE_LABEL if v.offline else v.model,
        "prompt_hash": v.prompt_hash,
        "raw_reply": v.raw_reply,
        "prompt_tokens": v.prompt_tokens,
        "completion_tokens": v.completion_tokens,
        "cost_usd": v.cost_usd,
        "latency_ms": v.latency_ms,
        "attempts": v.attempts,
        "reason": v.reason,
        "created_at": aware(v.created_at),  # SQLite hands stored UTC back naive
    }
