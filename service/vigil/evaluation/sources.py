"""Where rule quality is measured: recorded files (rules run here) or stored traffic (findings as stored).

Failure by an outcome: a *good* outcome (``task_success``, a reward) fails when its value is below a bar
(1 unless the flagging policy says otherwise); a *bad* outcome (``escalation``, ``thumbs_down``) fails
when it happened (value above 0). A conversation without a value for a good outcome is left out and
counted: nobody knows whether it succeeded. Without a bad outcome, it did not happen.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from vigil import ingest
from vigil.errors import VigilError
from vigil.evaluation.errors import EvaluationError
from vigil.evaluation.quality import Fired, Observation, RuleInfo
from vigil.review import FlaggingPolicy
from vigil.rules import SEVERITY_RANK, Finding, RuleEngine
from vigil.schema import Conversation
from vigil.store.db import among
from vigil.store.models import ConversationRow, FindingRow, OutcomeRow

Polarity = Literal["auto", "good", "bad"]
STORED_LIMIT = 20_000  # newest conversations measured per request: intervals stay useful, the read flat


class Judge:
    """Failure by an outcome: ``failed(values)`` is True/False, or None where unknown."""

    def __init__(self, outcome: str, polarity: Polarity, policy: FlaggingPolicy) -> None:
        rule = policy.outcomes.get(outcome)
        self.outcome = outcome
        self.bar = 1.0
        if polarity == "auto":
            polarity = "good" if rule is None or rule.below is not None else "bad"
        if polarity == "good" and rule is not None and rule.below is not None:
            self.bar = rule.below
        if polarity == "bad":
            self.bar = rule.above if rule is not None and rule.above is not None else 0.0
        self.polarity = polarity

    def failed(self, values: Sequence[float]) -> bool | None:
        if self.polarity == "bad":
            return any(v > self.bar for v in values)
        if not values:
            return None
        return values[-1] < self.bar


def review_threshold(policy: FlaggingPolicy) -> str | None:
    """The lowest severity whose findings queue a conversation for review (weight above 0)."""
    weighted = [s for s, w in policy.findings.severity.items() if w > 0]
    return min(weighted, key=SEVERITY_RANK.__getitem__, default=None)


def rule_infos(engine: RuleEngine) -> list[RuleInfo]:
    return [RuleInfo(r.pack, r.id, r.spec.severity, r.type.name) for r in engine.rules]


def _fired(findings: Iterable[Finding | Any], pack_of: dict[str, str], policy: FlaggingPolicy) -> tuple[Fired, ...]:
    out = []
    for f in findings:
        details = f.details or {}
        if details.get("rule_error"):
            continue
        queues = bool(policy.finding_reasons([{"rule_id": f.rule_id, "severity": f.severity, "message": ""}]))
        out.append(Fired(pack_of.get(f.rule_id, "(unknown)"), f.rule_id, f.severity, queues))
    return tuple(out)


def _packs(engine: RuleEngine, agent: str, version: str) -> frozenset[str]:
    return frozenset(r.pack for r in engine.rules_for(agent, version))


def conversations(paths: Sequence[Path]) -> Iterator[Conversation]:
    for path in paths:
        if not path.is_file():
            raise EvaluationError(f"{path}: no such file")
        try:
            yield from ingest.load_file(path)
        except VigilError as exc:
            raise EvaluationError(str(exc)) from None


def task_half(task_id: str | None) -> str:
    """``a`` or ``b``: a fixed split of task ids (sha256), to design checks on one half and report the other."""
    digest = hashlib.sha256((task_id or "").encode()).digest()
    return "a" if digest[0] % 2 == 0 else "b"


def from_conversations(
    convs: Iterable[Conversation],
    engine: RuleEngine,
    policy: FlaggingPolicy,
    judge: Judge,
    half: str | None = None,
) -> tuple[list[Observation], int]:
    """Run the packs on each conversation; failure from its own recorded outcomes."""
    pack_of = {r.id: r.pack for r in engine.rules}
    obs: list[Observation] = []
    left_out = 0
    for conv in convs:
        if half is not None and task_half(conv.task_id) != half:
            continue
        failed = judge.failed([o.value for o in conv.outcomes if o.type == judge.outcome])
        if failed is None:
            left_out += 1
            continue
        findings = _fired(engine.evaluate(conv), pack_of, policy)
        packs = _packs(engine, conv.agent_id, conv.agent_version)
        obs.append(Observation(conv.conversation_id, conv.task_id, failed, packs, findings))
    return obs, left_out


def stored_scope(agent: str | None, version: str | None, since: datetime | None) -> str:
    """The stored traffic :func:`from_store` read, as words (`` of agent 'a' at version 'v' since …``): what
    a report that found no conversation with the outcome names, so it does not read as if the outcome were
    never recorded when it is the agent, version or window that matched nothing."""
    of = (f" of agent {agent!r}" if agent else "") + (f" at version {version!r}" if version else "")
    return of + (f" since {since.isoformat()}" if since else "")


def from_store(
    session: Session,
    engine: RuleEngine,
    policy: FlaggingPolicy,
    judge: Judge,
    since: datetime | None = None,
    agent: str | None = None,
    version: str | None = None,
    limit: int = STORED_LIMIT,
) -> tuple[list[Observation], int]:
    """Stored conversations (the newest ``limit`` in the window: a bounded sample, so the read stays flat
    as traffic grows) joined to their findings and outcomes, looked up by id."""
    c = ConversationRow
    q = select(c.conversation_id, c.task_id, c.agent_id, c.agent_version, c.finding_count)
    if since is not None:
        q = q.where(ConversationRow.received_at >= since)
    if agent:
        q = q.where(ConversationRow.agent_id == agent)
    if version:
        q = q.where(ConversationRow.agent_version == version)
    rows = session.execute(q.order_by(ConversationRow.received_at.desc()).limit(limit)).all()
    ids = [r.conversation_id for r in rows]
    flagged = [r.conversation_id for r in rows if r.finding_count]  # counted when its findings were stored
    findings: dict[str, list[Any]] = defaultdict(list)
    outcomes: dict[str, list[float]] = defaultdict(list)
    F, Out = FindingRow, OutcomeRow
    # the ids themselves: given a subquery of 20,000 ids Postgres hashes them and reads every stored finding
    # and outcome (seconds at 10M conversations) instead of looking each id up
    fq = select(F.conversation_id, F.rule_id, F.severity, F.details).where(among(session, F.conversation_id, flagged))
    for f in session.execute(fq):
        findings[f.conversation_id].append(f)
    oq = (
        select(Out.conversation_id, Out.value)
        .where(among(session, Out.conversation_id, ids), Out.type == judge.outcome)
        .order_by(Out.occurred_at)
    )
    for cid, value in session.execute(oq):
        outcomes[cid].append(value)
    pack_of = {r.id: r.pack for r in engine.rules}
    applies: dict[tuple[str, str], frozenset[str]] = {}  # the packs of each agent version, matched once
    obs: list[Observation] = []
    left_out = 0
    for r in rows:
        failed = judge.failed(outcomes.get(r.conversation_id, []))
        if failed is None:
            left_out += 1
            continue
        # a new revision replaces its conversation's findings, so every stored finding is current
        fired = _fired(findings.get(r.conversation_id, []), pack_of, policy)
        of = (r.agent_id, r.agent_version)
        if of not in applies:
            applies[of] = _packs(engine, *of)
        obs.append(Observation(r.conversation_id, r.task_id, failed, applies[of] | {f.pack for f in fired}, fired))
    return obs, left_out
