"""``vigil calibrate``: measure a judge on a labelled set, from its existing verdicts or by running it.

Running it reuses the judge stage's parts for one conversation: the prompt (``build_messages``), the
engine's call with its limits, retries and error classification (``JudgeEngine.call_with_retries``), the
strict reply parser with the worker's re-asks (``ask``), and the offline judge when no provider key is
configured. Nothing is queued or stored as a production verdict.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select

from vigil.calibration.errors import CalibrationError
from vigil.calibration.labelsets import FileVerdict, LabelledItem, LabelledSet
from vigil.calibration.report import Pair
from vigil.judge import (
    JudgeEngine,
    JudgeStage,
    JudgeUnavailable,
    Parsed,
    ProviderError,
    Reply,
    ask,
    build_messages,
    check_messages,
    offline_verdict,
)
from vigil.rules import RuleEngine
from vigil.schema import Conversation
from vigil.store import reads
from vigil.store.models import ConversationRow


def pairs_from_verdicts(
    labels: LabelledSet, verdicts: dict[str, FileVerdict], default_version: str
) -> tuple[list[Pair], list[str]]:
    """Join human labels with a judge's recorded verdicts; returns the pairs and the ids without a verdict."""
    pairs, missing = [], []
    for item in labels.items:
        v = verdicts.get(item.conversation_id)
        if v is None:
            missing.append(item.conversation_id)
            continue
        pairs.append(
            Pair(
                item.conversation_id,
                item.human_fail,
                v.verdict,
                v.judge_version or default_version,
                item.category,
                v.categories,
            )
        )
    return pairs, missing


async def judge_one(engine: JudgeEngine, rules: RuleEngine, judge: str, conv: Conversation) -> Parsed:
    """One verdict of ``judge`` on ``conv``, as the worker would reach it, without queueing or storing it."""
    lane = engine.lanes[judge]
    if lane.offline:
        findings = [(f.rule_id, f.rule_type, f.severity, f.message) for f in rules.evaluate(conv)]
        return offline_verdict(lane.judge, conv, findings)
    messages = build_messages(lane.judge, conv)

    async def send() -> tuple[Reply, float]:
        reply, ms, _attempts = await engine.call_with_retries(lane, messages, check=check_messages(lane.judge))
        return reply, ms

    try:
        return (await ask(engine, lane, send)).parsed  # a reply that cannot be read is asked again, bounded
    except ProviderError as err:
        if err.kind == "rejected":  # including a 400 the judge's check request showed to be this one's own
            return Parsed.unscored(err.reason, err.detail[:500])
        raise


def resolve_conversations(sessions: Any, items: list[LabelledItem]) -> list[str]:
    """Fill in conversations given by id only from the store; returns the ids that are not stored."""
    wanted = [i.conversation_id for i in items if i.conversation is None]
    docs: dict[str, str] = {}
    with sessions() as s:
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            rows = s.execute(
                select(ConversationRow.conversation_id, ConversationRow.document).where(
                    ConversationRow.conversation_id.in_(chunk)
                )
            )
            docs.update((cid, doc) for cid, doc in rows)
    missing = []
    for item in items:
        if item.conversation is None:
            doc = docs.get(item.conversation_id)
            data = None if doc is None else reads.read_document(doc)
            try:
                item.conversation = None if data is None else Conversation.model_validate(data)
            except ValidationError:
                item.conversation = None
            if item.conversation is None:
                missing.append(item.conversation_id)
    return missing


async def run_judge(
    engine: JudgeEngine, rules: RuleEngine, judge: str, labels: LabelledSet
) -> tuple[list[Pair], list[str]]:
    """Judge every labelled conversation (concurrently, under the judge's own limits)."""
    if judge not in engine.lanes:
        raise CalibrationError(f"no judge {judge!r}; judges: {sorted(engine.lanes)}")
    lane = engine.lanes[judge]
    gate = asyncio.Semaphore(lane.judge.spec.limits.concurrency)
    todo = [i for i in labels.items if i.conversation is not None]
    skipped = [i.conversation_id for i in labels.items if i.conversation is None]

    async def one(item: LabelledItem) -> Pair:
        assert item.conversation is not None
        async with gate:
            parsed = await judge_one(engine, rules, judge, item.conversation)
        return Pair(
            item.conversation_id,
            item.human_fail,
            parsed.verdict,
            lane.judge.version,
            item.category,
            list(parsed.categories),
        )

    try:
        pairs = await asyncio.gather(*(one(i) for i in todo))
    except JudgeUnavailable as exc:
        raise CalibrationError(str(exc)) from None
    except ProviderError as exc:
        raise CalibrationError(f"judge {judge!r}: {exc}") from None
    return list(pairs), skipped


async def calibrate(
    rt: Any,
    judge: str,
    labels: LabelledSet,
    verdicts: dict[str, FileVerdict] | None = None,
    pairwise: tuple[list[str | None], list[str | None]] | None = None,
    pairwise_human: list[str | None] | None = None,
) -> dict[str, Any]:
    """The calibration report of ``judge`` on a labelled set: from ``verdicts`` if given, else by judging.

    ``rt`` is a wired :class:`~vigil.runtime.Runtime` (its judge stage, rules, sessions and settings).
    """
    from vigil.calibration.report import Thresholds, report
    from vigil.calibration.stats import both_orders, position_bias, three_way_agreement

    s = rt.settings
    stage = rt.find(JudgeStage)
    engine: JudgeEngine | None = stage.engine if stage is not None else None
    if verdicts is not None:
        version = engine.judges[judge].version if engine and judge in engine.judges else "unknown"
        pairs, missing = pairs_from_verdicts(labels, verdicts, version)
        mode = "verdicts"
    else:
        if engine is None or judge not in engine.lanes:
            known = sorted(engine.lanes) if engine else []
            raise CalibrationError(
                f"no judge {judge!r} to run (judges: {known}); pass a verdicts file to measure its verdicts"
            )
        # database reads and the statistics run in a worker thread: the API awaits this on its event loop
        missing = await asyncio.to_thread(resolve_conversations, rt.sessions, labels.items)
        pairs, _ = await run_judge(engine, rt.rules, judge, labels)
        mode = "offline" if engine.lanes[judge].offline else "live"
    thresholds = Thresholds(s.calibration_min_labels, s.calibration_min_kappa)
    result = await asyncio.to_thread(report, judge, labels.path, pairs, thresholds)
    result.update(mode=mode, unsure=labels.unsure, missing=missing)
    if pairwise is not None:
        result["position_bias"] = position_bias(*pairwise)
        if pairwise_human is not None and any(h is not None for h in pairwise_human):
            result["three_way"] = {
                "first_order": three_way_agreement(pairwise_human, pairwise[0]),
                "both_orders": three_way_agreement(pairwise_human, both_orders(*pairwise)),
            }
    return result
