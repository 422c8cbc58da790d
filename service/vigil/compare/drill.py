"""The conversations behind one row of the compare table, for one side: what each row's link lists.

A rate's conversations are the ones it counts (a rule's findings, a judge's failing verdicts, a bad
outcome, a failed task); a mean's are every conversation of the version, the largest value first.
Reads are bounded by the time window, a page size and, for the metadata rates, the metadata sample.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Select, exists, select
from sqlalchemy.orm import Session

from vigil.compare.tasks import SUCCESS, ending, latest_range
from vigil.errors import VigilError
from vigil.store.models import ConversationRow, FindingRow, OutcomeLinkRow, VerdictRow
from vigil.store.reads import read_document, summary_dict
from vigil.store.rollups import hour_of
from vigil.store.signals import OFFLINE_SUFFIX, finished, real_finding

PAGE = 50


class UnknownSignal(VigilError):
    """A signal name the compare table does not have."""


def _what(signal: str) -> tuple[Any, str, Any]:
    """(condition on ConversationRow, description, order) for a signal counted from stored columns."""
    C, F, L, V = ConversationRow, FindingRow, OutcomeLinkRow, VerdictRow
    newest = C.received_at.desc()
    head, sep, name = signal.partition(":")
    if sep and not name.removesuffix(OFFLINE_SUFFIX).strip():  # "rule:", "judge:", "judge::offline"
        raise UnknownSignal(f"no compare signal {signal!r}: name the {head} after the colon")
    if signal.startswith("rule:"):
        rule = signal.removeprefix("rule:")
        cond = exists().where(F.conversation_id == C.conversation_id, F.rule_id == rule, real_finding())
        return cond, f"with a finding of rule {rule}", newest
    if signal == "forbidden_tool":
        cond = exists().where(F.conversation_id == C.conversation_id, F.rule_type == "forbidden_tool", real_finding())
        return cond, "with a forbidden tool call", newest
    if signal == "tool_error":
        return C.tool_error_count > 0, "with a failed tool call", newest
    if signal.startswith("judge:"):
        judge = signal.removeprefix("judge:")
        offline = judge.endswith(OFFLINE_SUFFIX)
        cond = exists().where(
            V.conversation_id == C.conversation_id,
            V.judge == judge.removesuffix(OFFLINE_SUFFIX),
            V.offline.is_(offline),
            V.verdict == "fail",
        )
        return cond, f"the judge {judge} failed", newest
    if signal in ("outcome:task_success",) or signal.startswith("tasks:"):
        cond = exists().where(
            L.conversation_id == C.conversation_id, L.type == SUCCESS, L.attributed, L.happened.is_(False)
        )
        return cond, "whose task failed", newest
    if signal.startswith("outcome:"):
        kind = signal.removeprefix("outcome:")
        cond = exists().where(L.conversation_id == C.conversation_id, L.type == kind, L.attributed, L.happened)
        return cond, f"with a {kind} outcome", newest
    if signal == "steps":
        return None, "by messages, most first", C.message_count.desc()
    if signal == "cost_usd":
        return None, "by cost, most first", C.cost_usd.desc()
    if signal == "latency_p95_ms":
        return None, "by latency, slowest first", C.latency_ms.desc()
    raise UnknownSignal(f"no compare signal {signal!r}")


def conversations_behind(
    session: Session,
    agent: str,
    version: str,
    signal: str,
    offset: int = 0,
    since: datetime | None = None,
    until: datetime | None = None,
    metadata_sample: int = 500,
    outcomes_before: datetime | None = None,
) -> dict[str, Any]:
    """A page of the conversations of ``agent``/``version`` behind ``signal``; an outcome's, like its row,
    only those received in whole hours before ``outcomes_before`` (task success's failed trials whenever)."""
    C = ConversationRow
    base: Select[Any] = select(C).where(C.agent_id == agent, C.agent_version == version, finished())
    if since is not None:
        base = base.where(C.received_at >= since)
    if until is not None:
        base = base.where(C.received_at < until)
    if signal in ("error_rate", "truncation_rate"):
        # said only in the metadata: the ones the table's sample read
        picked = []
        span = latest_range(session, agent, version, metadata_sample, since, until)
        rows: Any = []
        if span is not None:
            within = base.where(C.received_at >= span[0], C.received_at <= span[1])
            rows = session.scalars(within.order_by(C.received_at.desc()).limit(metadata_sample))
        for row in rows:
            doc = read_document(row.document) or {}
            meta = doc.get("metadata")
            ended = ending(meta) if isinstance(meta, dict) else None
            if ended and ended[0 if signal == "error_rate" else 1]:
                picked.append(row)
        what = "that ended in an error" if signal == "error_rate" else "that hit a budget"
        page = picked[offset : offset + PAGE]
        total: int | None = len(picked)
    else:
        cond, what, order = _what(signal)
        q = base if cond is None else base.where(cond)
        if outcomes_before is not None and signal.startswith("outcome:") and signal != "outcome:task_success":
            cut = hour_of(outcomes_before)
            q = q.where(C.received_at < cut)
            what += f", received before {cut:%Y-%m-%d %H:%M} UTC"
        span = latest_range(session, agent, version, 1, since, until)
        if span is not None:  # start from the version's newest row, not from everyone's
            q = q.where(C.received_at <= span[1])
        page = list(session.scalars(q.order_by(order, C.conversation_id).offset(offset).limit(PAGE + 1)))
        # the last page tells the total; past it (an offset beyond the end) nothing does
        total = None if len(page) > PAGE or (offset and not page) else offset + len(page)
        page = page[:PAGE]
    return {
        "agent_id": agent,
        "version": version,
        "signal": signal,
        "what": what,
        "offset": offset,
        "total": total,
        "more": bool(page) and (total is None or total > offset + len(page)),
        "past_end": offset > 0 and not page,
        "conversations": [summary_dict(r) for r in page],
    }
