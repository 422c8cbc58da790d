"""What the home page says is happening now: alerts, traffic and flag rate per version, queue, judge spend.

Every read is bounded whatever the stored history: the last hour's conversations by an index range on
``received_at``; the last day's from the detector's hourly counts (24 rows per version); conversations
flagged (entered the review queue) in a window by the ``created_at`` index of the queue; labels by time;
open items by status; detections by the open ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vigil.detector.api import list_alerts
from vigil.detector.models import QualityCountRow
from vigil.detector.pages import evidence
from vigil.detector.twins import fed_by_rules
from vigil.judge.api import judge_info
from vigil.judge.stage import JudgeStage
from vigil.runtime import Runtime
from vigil.store.models import ConversationRow, ReviewItemRow, ReviewLabelRow
from vigil.store.signals import TOOL_ERROR, version_key

HOUR, DAY = timedelta(hours=1), timedelta(days=1)
WINDOWS = (("hour", HOUR), ("day", DAY))


@dataclass
class VersionTraffic:
    agent: str
    version: str
    conversations: dict[str, int] = field(default_factory=lambda: {w: 0 for w, _ in WINDOWS})  # stored, per window
    flagged: dict[str, int] = field(default_factory=lambda: {w: 0 for w, _ in WINDOWS})  # entered the review queue

    def flag_rate(self, window: str) -> float | None:
        """Items that entered the queue per conversation stored in the window (a later outcome or verdict
        can flag an older conversation, so in a quiet window it may pass 100%)."""
        n = self.conversations.get(window, 0)
        return self.flagged.get(window, 0) / n if n else None


def traffic(s: Session, now: datetime) -> list[VersionTraffic]:
    """Conversations stored and flagged for review per agent version, in the last hour and the last day."""
    out: dict[tuple[str, str], VersionTraffic] = {}

    def row(agent: str, version: str) -> VersionTraffic:
        return out.setdefault((agent, version), VersionTraffic(agent, version))

    hour_ago, day_ago = now - HOUR, now - DAY
    stored = (
        select(ConversationRow.agent_id, ConversationRow.agent_version, func.count())
        .where(ConversationRow.received_at >= hour_ago)
        .group_by(ConversationRow.agent_id, ConversationRow.agent_version)
    )
    for agent, version, n in s.execute(stored):
        row(agent, version).conversations["hour"] = int(n)
    # the day from the detector's hourly counts: every finished conversation is one observation of tool_error
    counted = (
        select(QualityCountRow.agent_id, QualityCountRow.agent_version, func.sum(QualityCountRow.n))
        .where(
            QualityCountRow.signal == TOOL_ERROR,
            QualityCountRow.hour >= day_ago.replace(minute=0, second=0, microsecond=0),
        )
        .group_by(QualityCountRow.agent_id, QualityCountRow.agent_version)
    )
    for agent, version, n in s.execute(counted):
        row(agent, version).conversations["day"] = int(n or 0)
    for window, since in (("hour", hour_ago), ("day", day_ago)):
        flagged = (
            select(ReviewItemRow.agent_id, ReviewItemRow.agent_version, func.count())
            .where(ReviewItemRow.created_at >= since, ReviewItemRow.agent_id.is_not(None))
            .group_by(ReviewItemRow.agent_id, ReviewItemRow.agent_version)
        )
        for item_agent, item_version, n in s.execute(flagged):
            row(str(item_agent), str(item_version)).flagged[window] = int(n)
    for t in out.values():  # the day holds the hour, however the detector's counts lag
        t.conversations["day"] = max(t.conversations["day"], t.conversations["hour"])
    return sorted(out.values(), key=lambda t: (t.agent, version_key(t.version)), reverse=True)


def queue_state(s: Session, now: datetime) -> dict[str, Any]:
    """Open items, items added and labels saved in the last hour and day, and the busiest reviewers today."""
    open_items = s.scalar(
        select(func.count())
        .select_from(ReviewItemRow)
        .where(ReviewItemRow.status == "open", ReviewItemRow.agent_id.is_not(None))
    )
    labelled: dict[str, int] = {}
    for window, span in WINDOWS:
        labelled[window] = int(
            s.scalar(select(func.count()).select_from(ReviewLabelRow).where(ReviewLabelRow.created_at >= now - span))
            or 0
        )
    reviewers = s.execute(
        select(ReviewLabelRow.reviewer, func.count())
        .where(ReviewLabelRow.created_at >= now - timedelta(days=1))
        .group_by(ReviewLabelRow.reviewer)
        .order_by(func.count().desc())
        .limit(5)
    ).all()
    return {
        "open": int(open_items or 0),
        "labelled": labelled,
        "reviewers": [(name, int(n)) for name, n in reviewers],
    }


def judge_spend(rt: Runtime, s: Session) -> list[dict[str, Any]]:
    """Each judge's spend today against its daily budget (empty when no judge is configured)."""
    stage = rt.find(JudgeStage)
    if stage is None or not stage.engine.lanes:
        return []
    out = []
    for info in judge_info(stage, s, sorted(stage.engine.lanes)):
        budget, spent = info["budget_usd"], info["spent_today_usd"]
        out.append({**info, "budget_share": spent / budget if budget else None})
    return out


def snapshot(rt: Runtime, now: datetime | None = None) -> dict[str, Any]:
    """Everything the home page shows, read in one session; its windows end at ``now``, by default the
    database's clock (which stamps what they count), not this host's."""
    now = now or rt.now()
    with rt.sessions() as s:
        alerts = list_alerts(s, fed_by_rules(rt.rules), active=True, limit=50)["active"]
        for a in alerts:
            a["evidence"] = evidence(s, a)
        return {
            "now": now,
            "alerts": alerts,
            "traffic": traffic(s, now),
            "queue": queue_state(s, now),
            "judges": judge_spend(rt, s),
        }


def as_json(data: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` as plain data (``GET /v1/overview``, ``vigil status --json``)."""
    traffic = [{**asdict(t), "flag_rate": {w: t.flag_rate(w) for w, _ in WINDOWS}} for t in data["traffic"]]
    return {**data, "traffic": traffic}
