"""A runtime with every stage and a seeded history: a week of traffic and a regression the detector raises.

Used by the console's tests and by ``python -m bench.screenshots`` (the docs' pictures).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import select, update

from tests.support.app import make_settings
from tests.support.traffic import mixed
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.detector.models import DetectionRow
from vigil.detector.wiring import build_detector
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.runtime import Runtime
from vigil.schema import Conversation
from vigil.store.models import ConversationRow, OutcomeLinkRow, ReviewItemRow

# the detector decides quickly on little traffic, and counts outcomes an hour after their hour
FAST = {"detector_min_baseline": 200, "detector_settle_seconds": 0.0, "detector_outcome_settle_hours": 1.0}
AGENT, BASELINE, CANDIDATE = "support-bot", "v1.4.0", "v1.5.0"


def console_runtime(url: str, roles: set[str] | None = None, **overrides: Any) -> Runtime:
    """A runtime wired with every stage (the API role: no background workers unless ``roles`` says so)."""
    rt = build_runtime(make_settings(url, **{**FAST, **overrides}), registry=CollectorRegistry())
    return wire(rt, roles or {"api"})


def store(rt: Runtime, convs: list[dict[str, Any]]) -> None:
    rt.pipeline.process([Conversation.model_validate(c) for c in convs], "test")


def seed_week(
    rt: Runtime,
    now: datetime | None = None,
    per_hour: int = 8,
    days: int = 7,
    failure_rate: float = 0.08,
    seed: int = 5,
) -> int:
    """``days`` of the baseline version's traffic, hour by hour, stored as if received then, with outcomes.

    Returns how many conversations were stored. Run before the detector's first pass, which counts them.
    """
    now = now or datetime.now(UTC)
    sim = Simulator(parse_versions(f"{BASELINE}:{failure_rate}", AGENT), seed)
    rng = random.Random(seed)
    first = now.replace(minute=0, second=0, microsecond=0) - timedelta(days=days)
    convs: list[dict[str, Any]] = []
    for h in range(days * 24):
        at = first + timedelta(hours=h, minutes=rng.randint(0, 40))
        convs.extend(sim.stream(per_hour, start=at))
    for i in range(0, len(convs), 500):
        store(rt, convs[i : i + 500])
    received = (
        select(ConversationRow.received_at)
        .where(ConversationRow.conversation_id == ReviewItemRow.conversation_id)
        .scalar_subquery()
    )
    with rt.sessions.begin() as s:
        s.execute(update(ConversationRow).values(received_at=ConversationRow.started_at))
    sink = rt.hooks.outcome_sink
    if sink is not None:
        sink([o for c in convs for o in sim.outcomes_for(c) if datetime.fromisoformat(o["occurred_at"]) < now])
        # as if each outcome had been joined when its conversation was stored (the detector counts an
        # hour's outcomes joined before the hour settled)
        with rt.sessions.begin() as s:
            s.execute(update(OutcomeLinkRow).values(linked_at=OutcomeLinkRow.conversation_received_at))
    with rt.sessions.begin() as s:  # flagged when received, by a finding or by the outcomes joined then
        s.execute(update(ReviewItemRow).values(created_at=received))
    return len(convs)


def regressed(n: int, defect: str, share: float, seed: int) -> list[dict[str, Any]]:
    """``n`` conversations of the candidate version of which about ``share`` carry ``defect``."""
    return mixed(n, CANDIDATE, defect, share, seed, agent=AGENT)


def raise_alert(rt: Runtime, defect: str = "cancel_delivered", batches: int = 12) -> list[DetectionRow]:
    """Count the stored history, then store the candidate's regressed traffic until the detector raises alerts."""
    det = build_detector(rt)
    det.tick()
    for i in range(batches):
        store(rt, regressed(50, defect, 0.25, 100 + i))
        det.tick()
        with rt.sessions() as s:
            found = list(s.scalars(select(DetectionRow).where(DetectionRow.ended_at.is_(None))))
        if found:
            return found
    raise AssertionError(f"the detector raised nothing after {batches} batches of regressed traffic")
