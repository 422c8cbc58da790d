"""Per-task data of one agent version: the paired rows of the compare table and how the version was run.

Two kinds of read, both bounded by the time window, on indexed columns:

- **task success**: per task, its trials (finished conversations of the task with an attributed
  ``task_success`` outcome) and successes in the window, from the task rollups (one row per task and
  day); a task is one cluster, each conversation a rollout.
- **metadata**: the ``metadata`` of the latest ``metadata_sample`` conversations (found on the
  (agent, version, received) index: their time range first, then the rows), for the error and
  truncation rates (``termination_reason``, ``error``, ``truncated``) and the protocol each side was
  produced by (model, sampling settings, harness, tool set, grader, budgets); the judges' versions and
  models from the latest ``metadata_sample`` verdicts (the (agent, version, created) index).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vigil.store import rollups
from vigil.store.db import aware
from vigil.store.models import ConversationRow, VerdictRow
from vigil.store.reads import newest_received, read_document
from vigil.store.signals import OFFLINE_SUFFIX, finished

SUCCESS = "task_success"
# how benchmark harnesses say a run ended (τ²-bench, τ-bench, Inspect limits, OpenAI finish reasons)
ERROR_REASONS = frozenset({"too_many_errors", "agent_error", "user_error", "invalid_agent_message", "error"})
TRUNCATION_REASONS = frozenset(
    {"max_steps", "max_turns", "max_tokens", "timeout", "length", "token_limit", "message_limit", "time_limit"}
)
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "seed", "max_tokens", "reasoning_effort")
BUDGET_KEYS = ("max_steps", "max_turns", "max_errors", "max_tokens_budget", "time_limit", "token_limit")
PROTOCOL_KEYS = ("model", "sampling", "harness", "tools", "grader", "budgets")
NOT_RECORDED = "(not recorded)"


@dataclass(slots=True)
class TaskData:
    """One version's per-task rollouts and the metadata of its latest conversations."""

    tasks: dict[str, tuple[int, int]] = field(default_factory=dict)  # task -> (trials, successes)
    error: dict[str, list[float]] = field(default_factory=dict)  # task (or conversation) -> 1.0/0.0
    truncated: dict[str, list[float]] = field(default_factory=dict)
    metadata_read: int = 0
    protocol: dict[str, Counter[str]] = field(default_factory=dict)  # key -> value -> conversations
    judges: dict[str, Counter[str]] = field(default_factory=dict)  # judge signal -> version -> verdicts

    @property
    def repeated(self) -> dict[str, tuple[int, int]]:
        """Tasks with at least two rollouts."""
        return {t: nc for t, nc in self.tasks.items() if nc[0] >= 2}


def _window(q: Any, col: Any, since: datetime | None, until: datetime | None) -> Any:
    if since is not None:
        q = q.where(col >= since)
    if until is not None:
        q = q.where(col < until)
    return q


def _canon(value: Any) -> str | None:
    if value is None or value == {} or value == [] or value == "":
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _tool_names(tools: Any) -> str | None:
    if not isinstance(tools, list):
        return _canon(tools)
    names = set()
    for t in tools:
        if isinstance(t, str):
            names.add(t)
        elif isinstance(t, dict):
            fn = t.get("function")
            name = t.get("name") or (fn.get("name") if isinstance(fn, dict) else None)
            if name:
                names.add(str(name))
    return ", ".join(sorted(names)) or None


def protocol_of(meta: dict[str, Any]) -> dict[str, str | None]:
    """What a conversation's metadata says about how it was produced (keys of :data:`PROTOCOL_KEYS`)."""
    model = meta.get("model")
    if model is None and isinstance(meta.get("models"), list):  # OpenTelemetry traces: the models called
        model = ", ".join(sorted({str(m) for m in meta["models"]}))
    sampling = meta.get("sampling")
    if sampling is None:
        sampling = {k: meta[k] for k in SAMPLING_KEYS if meta.get(k) is not None}
    budgets = meta.get("budgets")
    if budgets is None:
        budgets = {k: meta[k] for k in BUDGET_KEYS if meta.get(k) is not None}
    return {
        "model": _canon(model),
        "sampling": _canon(sampling),
        "harness": _canon(meta.get("harness") or meta.get("source")),
        "tools": _tool_names(meta.get("tools")),
        "grader": _canon(meta.get("grader")),
        "budgets": _canon(budgets),
    }


def ending(meta: dict[str, Any]) -> tuple[bool, bool] | None:
    """``(error, truncated)`` as the metadata says, or None when it says nothing about how the run ended."""
    reason = meta.get("termination_reason")
    said = reason is not None or "error" in meta or "truncated" in meta
    if not said:
        return None
    reason = str(reason or "").lower()
    error = reason in ERROR_REASONS or bool(meta.get("error"))
    truncated = reason in TRUNCATION_REASONS or bool(meta.get("truncated"))
    return error, truncated


def task_counts(
    session: Session, agent: str, version: str, since: datetime | None = None, until: datetime | None = None
) -> dict[str, tuple[int, int]]:
    """(trials, successes) per task of the version in the window, every task (the rollups, by day)."""
    return rollups.task_counts(session, agent, version, since, until, min_trials=1)


def latest_range(
    session: Session, agent: str, version: str, n: int, since: datetime | None, until: datetime | None
) -> tuple[datetime, datetime] | None:
    """When the version's latest ``n`` conversations in the window were received (first, last), or None.

    Two reads of the (agent, version, received) index alone: the rows themselves are then read within
    that range, so a version whose traffic ended long ago is not found by scanning everyone's newer rows.
    """
    C = ConversationRow
    q = _window(
        select(C.received_at).where(C.agent_id == agent, C.agent_version == version), C.received_at, since, until
    ).order_by(C.received_at.desc())
    last = newest_received(session, agent, version, since, until)
    if last is None:
        return None
    first = session.scalar(q.offset(n - 1).limit(1))
    if first is None:
        first = session.scalar(q.order_by(None).order_by(C.received_at.asc()).limit(1))
    return aware(first), aware(last)


def load_tasks(
    session: Session,
    agent: str,
    version: str,
    metadata_sample: int,
    since: datetime | None = None,
    until: datetime | None = None,
    tasks: dict[str, tuple[int, int]] | None = None,
    judges: Iterable[str] = (),
) -> TaskData:
    """``tasks``: the version's per-task counts in the window when the caller has read them already.
    ``judges``: the judges whose versions and models the protocol shows (``name`` or ``name:offline``, as
    :attr:`VersionData.judge` keys them), each from its newest ``metadata_sample`` verdicts in the window."""
    d = TaskData(tasks=task_counts(session, agent, version, since, until) if tasks is None else dict(tasks))
    C = ConversationRow
    mine = (C.agent_id == agent, C.agent_version == version, finished())
    span = latest_range(session, agent, version, metadata_sample, since, until)
    counts: dict[str, Counter[str]] = {k: Counter() for k in PROTOCOL_KEYS}
    rows: Any = []
    if span is not None:
        meta_q = select(C.conversation_id, C.task_id, C.document).where(
            *mine, C.received_at >= span[0], C.received_at <= span[1]
        )
        rows = session.execute(meta_q.order_by(C.received_at.desc()).limit(metadata_sample))
    for cid, task, text in rows:
        doc = read_document(text) or {}
        found = doc.get("metadata")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        d.metadata_read += 1
        for key, value in protocol_of(meta).items():
            counts[key][value or NOT_RECORDED] += 1
        ended = ending(meta)
        if ended is not None:
            d.error.setdefault(task or cid, []).append(float(ended[0]))
            d.truncated.setdefault(task or cid, []).append(float(ended[1]))
    d.protocol = {k: c for k, c in counts.items() if set(c) != {NOT_RECORDED}}

    # each judge's versions and models from its own newest verdicts (one range of ix_verdicts_judge_agent
    # per judge), so a busy judge never pushes a quiet one out of the protocol
    V = VerdictRow
    for key in judges:
        name = key.removesuffix(OFFLINE_SUFFIX)
        newest = _window(
            select(V.judge_version, V.model).where(
                V.judge == name,
                V.agent_id == agent,
                V.agent_version == version,
                V.offline.is_(key.endswith(OFFLINE_SUFFIX)),
            ),
            V.created_at,
            since,
            until,
        )
        newest = newest.order_by(V.created_at.desc()).limit(metadata_sample).subquery()
        judge_q = select(newest.c.judge_version, newest.c.model, func.count()).group_by(
            newest.c.judge_version, newest.c.model
        )
        for judge_version, model, n in session.execute(judge_q):
            d.judges.setdefault(f"judge:{key}", Counter())[f"{name} v{judge_version} ({model})"] += int(n)
    return d
