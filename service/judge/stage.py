"""The judge stage's parts in one process: definitions, engine, sampler and (in worker roles) the worker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from .engine import JudgeEngine
from .sampling import JudgeSampler
from .store import verdicts_for
from .worker import JudgeWorker


@dataclass
class JudgeStage:
    engine: JudgeEngine
    sampler: JudgeSampler
    worker: JudgeWorker | None = None

    def enrich(self, session: Session, conversation: dict[str, Any]) -> None:
        """``conversation_enrichers`` entry: adds ``verdicts`` to ``GET /v1/conversations/{id}``."""
        from .api import verdict_dict

        conversation["verdicts"] = [
            verdict_dict(v) for v in verdicts_for(session, conversation["conversation_id"])
        ]
