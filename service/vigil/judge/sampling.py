"""Which conversations a judge grades: a deterministic sample plus targeted always-judge rules.

The sampler runs inside the pipeline's batch transaction and only inserts judge requests; the worker
does the judging later, so the rule pipeline never waits on a model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased, load_only

from vigil.judge import store
from vigil.judge.definitions import Judge
from vigil.judge.models import JudgeRequestRow
from vigil.metrics import OTHER, Metrics
from vigil.store.db import clock as database_clock
from vigil.store.models import ConversationRow
from vigil.store.writes import Checked, stored_in_batch

_SCALE = float(1 << 64)


def sample_point(conversation_id: str, salt: str) -> float:
    """A uniform point in [0, 1) fixed by the id and salt: the same on every replica and every replay."""
    digest = hashlib.sha256(f"{salt}\x1f{conversation_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE


def is_sampled(conversation_id: str, salt: str, rate: float) -> bool:
    return sample_point(conversation_id, salt) < rate


class JudgeSampler:
    """The pipeline's downstream stage that enqueues judge requests (``on_stored``), and the outcome
    listener that enqueues one when a negative outcome arrives for a stored conversation."""

    def __init__(
        self,
        judges: dict[str, Judge],
        metrics: Metrics,
        clock: Callable[[], datetime] | None = None,
        min_versions: int = 50,
        min_per_hour_cap: int = 250,
    ) -> None:
        self.judges = judges
        self.metrics = metrics
        self.clock = clock  # tests: a time of their own; otherwise the database's (see _now)
        self.min_versions = min_versions
        self.min_per_hour_cap = min_per_hour_cap
        self._hour: datetime | None = None
        # (judge, agent, version) → conversations first requested this hour; only versions given the floor
        self._per_hour: dict[tuple[str, str, str], int] = {}
        self._floor_used: dict[str, int] = {}  # judge → this hour's min_per_hour requests (all versions)
        self._needs_stored_outcomes = any(j.spec.sampling.negative_outcomes for j in judges.values())

    def on_stored(self, session: Session, stored: Sequence[Checked]) -> None:
        """Enqueue the stored conversations each judge picks; count each conversation once per judge.

        A newer revision of a conversation a judge already picked is judged too (its pending request for
        an older revision is superseded), but takes no hourly slot and is not counted again.
        """
        if not self.judges or not stored:
            return
        now = self._now(session)
        negative = self._stored_outcomes(session, stored)
        # only a conversation stored before can have requests; a first revision needs no lookup
        prior = store.requests_for(session, self.judges, [i.conversation.conversation_id for i in stored if i.replaced])
        self._load_floor(session, stored, now)
        rows: list[dict[str, Any]] = []
        eligible: dict[tuple[str, str, str], int] = {}
        for item in stored:
            c = item.conversation
            for judge in self.judges.values():
                if not judge.applies(c.agent_id, c.agent_version):
                    continue
                if c.status == "in_progress" and not judge.spec.sampling.judge_in_progress:
                    continue
                earlier = prior.get((judge.name, c.conversation_id), [])
                picked = [p for p in earlier if p.reason != "manual"]
                # a replaced revision was eligible before if in-progress ones are judged; otherwise the
                # store keeps no earlier status, and the usual earlier revision is an in-progress one
                if not picked and not (item.replaced and judge.spec.sampling.judge_in_progress):
                    key = (judge.name, c.agent_id, c.agent_version)
                    eligible[key] = eligible.get(key, 0) + 1
                reason = self._reason(session, judge, item, negative.get(c.conversation_id, ()), now, floor=not earlier)
                if picked:
                    reason = reason or picked[0].reason
                elif reason and not earlier:
                    self._bump(judge.name, c.agent_id, c.agent_version)
                    if reason == "min_per_hour":
                        self._floor_used[judge.name] = self._floor_used.get(judge.name, 0) + 1
                if reason:
                    rows.append(
                        self._row(
                            judge,
                            c.conversation_id,
                            c.effective_revision,
                            c.agent_id,
                            c.agent_version,
                            reason,
                            now,
                        )
                    )
        for (name, agent, version), n in eligible.items():
            self._count("eligible", self.judges[name], agent, version, n=n)
        self._enqueue(session, rows, prior, bumped=True)

    def _reason(
        self,
        session: Session,
        judge: Judge,
        item: Checked,
        outcomes: Sequence[tuple[str, float]],
        now: datetime,
        floor: bool = True,
    ) -> str | None:
        c = item.conversation
        key = (judge.name, c.agent_id, c.agent_version)
        # only a version given the floor this hour has a count (loaded before this batch's own requests,
        # so that those, whatever their reason, count toward it)
        minimum = judge.spec.sampling.min_per_agent_version_per_hour if floor and key in self._per_hour else 0
        seen = self._per_hour.get(key, 0)
        if any(judge.severity_triggers(f.severity) for f in item.findings if not f.details.get("rule_error")):
            return "flagged"
        neg = judge.spec.sampling.negative_outcomes
        if neg is not None:
            inline = [(o.type, o.value) for o in c.outcomes]
            if any(neg.is_negative(t, v) for t, v in [*inline, *outcomes]):
                return "outcome"
        if is_sampled(c.conversation_id, judge.salt, judge.spec.sampling.rate):
            return "sampled"
        if minimum and seen < minimum and self._floor_used.get(judge.name, 0) < self.min_per_hour_cap:
            return "min_per_hour"
        return None

    def _load_floor(self, session: Session, stored: Sequence[Checked], now: datetime) -> None:
        """Give this batch's new versions the hourly minimum while places are free, and load the counts.

        A version gets the floor only if it is within the agent_version label budget and among the first
        ``min_versions`` of the hour, so a flood of distinct versions costs no more judge requests than
        the sample rate. A fixed number of statements per judge, whatever the number of versions.
        """
        hour = now.replace(minute=0, second=0, microsecond=0)
        if hour != self._hour:
            self._hour, self._per_hour, self._floor_used = hour, {}, {}
        for judge in self.judges.values():
            if not judge.spec.sampling.min_per_agent_version_per_hour:
                continue
            admitted = sum(1 for k in self._per_hour if k[0] == judge.name)
            new: set[tuple[str, str]] = set()
            for item in stored:
                c = item.conversation
                key = (judge.name, c.agent_id, c.agent_version)
                if key in self._per_hour or (c.agent_id, c.agent_version) in new:
                    continue
                if admitted + len(new) >= self.min_versions or not judge.applies(c.agent_id, c.agent_version):
                    continue
                if self.metrics.version(c.agent_version) == OTHER or self.metrics.agent(c.agent_id) == OTHER:
                    continue  # outside the label budget: a version nobody can chart gets the sample rate alone
                new.add((c.agent_id, c.agent_version))
            counts = self._hour_counts(session, judge, new, hour) if new else {}
            for agent, version in new:
                self._per_hour[(judge.name, agent, version)] = counts.get((agent, version), 0)
            # other replicas take floor requests too: the cap is read from the database every batch
            self._floor_used[judge.name] = (
                session.scalar(
                    select(func.count(JudgeRequestRow.id)).where(
                        JudgeRequestRow.judge == judge.name,
                        JudgeRequestRow.reason == "min_per_hour",
                        JudgeRequestRow.created_at >= hour,
                    )
                )
                or 0
            )

    @staticmethod
    def _hour_counts(
        session: Session, judge: Judge, keys: set[tuple[str, str]], hour: datetime
    ) -> dict[tuple[str, str], int]:
        """Conversations of each agent version first requested by ``judge`` this hour (not revisions)."""
        R, older = JudgeRequestRow, aliased(JudgeRequestRow)
        earlier = (
            select(older.id)
            .where(older.judge == R.judge, older.conversation_id == R.conversation_id, older.created_at < hour)
            .exists()
        )
        rows = session.execute(
            select(R.agent_id, R.agent_version, func.count(func.distinct(R.conversation_id)))
            .where(
                R.judge == judge.name,
                R.agent_version.in_({v for _, v in keys}),
                R.created_at >= hour,
                ~earlier,
            )
            .group_by(R.agent_id, R.agent_version)
        ).all()
        return {(a, v): n for a, v, n in rows if (a, v) in keys}

    def _stored_outcomes(self, session: Session, stored: Sequence[Checked]) -> dict[str, list[tuple[str, float]]]:
        """Outcomes that arrived before their conversation (joined here, since the listener saw no row)."""
        if not self._needs_stored_outcomes:
            return {}
        out: dict[str, list[tuple[str, float]]] = {}
        for cid, type_, value in store.outcomes_of(session, [i.conversation.conversation_id for i in stored]):
            out.setdefault(cid, []).append((type_, value))
        return out

    def _now(self, session: Session) -> datetime:
        """The database's clock, once per batch: a request enqueued by a replica whose host clock ran ahead
        was not due for the other workers until theirs caught up (3 h ahead: judged 3 h late)."""
        return self.clock() if self.clock is not None else database_clock(session)

    def _row(
        self, judge: Judge, cid: str, revision: int, agent: str, version: str, reason: str, now: datetime
    ) -> dict[str, Any]:
        return {
            "judge": judge.name,
            "conversation_id": cid,
            "revision": revision,
            "agent_id": agent,
            "agent_version": version,
            "reason": reason,
            "status": "pending",
            "attempts": 0,
            "next_attempt_at": now,
            "created_at": now,
        }

    def _enqueue(
        self,
        session: Session,
        rows: list[dict[str, Any]],
        prior: dict[tuple[str, str], list[store.Prior]] | None = None,
        bumped: bool = False,
    ) -> list[dict[str, Any]]:
        """Insert ``rows``; supersede pending requests for older revisions of the same conversations.

        Only a conversation the judge had no request for counts as sampled (and takes an hourly slot).
        """
        if not rows:
            return []
        if prior is None:
            prior = store.requests_for(session, {r["judge"] for r in rows}, [r["conversation_id"] for r in rows])
        fresh = store.enqueue(session, rows)
        older: list[int] = []
        for r in fresh:
            earlier = prior.get((r["judge"], r["conversation_id"]))
            if earlier:
                older += [p.id for p in earlier if p.status == "pending" and p.revision < r["revision"]]
                continue
            judge = self.judges[r["judge"]]
            self._count("sampled", judge, r["agent_id"], r["agent_version"], r["reason"])
            if not bumped:
                self._bump(judge.name, r["agent_id"], r["agent_version"])
        store.supersede(session, older)
        return fresh

    def _bump(self, judge: str, agent: str, version: str) -> None:
        key = (judge, agent, version)
        if key in self._per_hour:
            self._per_hour[key] += 1

    def _count(self, what: str, judge: Judge, agent: str, version: str, reason: str | None = None, n: int = 1) -> None:
        m = self.metrics
        labels = [judge.name, judge.version, m.agent(agent), m.version(version)]
        if what == "eligible":
            m.judge_eligible.labels(*labels).inc(n)
        else:
            m.judge_sampled.labels(*labels, reason).inc(n)

    def on_outcomes(self, session: Session, outcomes: Sequence[Any]) -> None:
        """``outcome_listeners`` entry: a negative outcome for a stored conversation enqueues a judgement."""
        if not self.judges or not outcomes:
            return
        now = self._now(session)
        ids = {o.conversation_id for o in outcomes}
        batch = stored_in_batch(session)  # what the batch just stored is not read back
        convs: dict[str, Any] = {cid: batch[cid] for cid in ids if cid in batch}
        if len(convs) < len(ids):
            cols = load_only(
                ConversationRow.conversation_id,
                ConversationRow.revision,
                ConversationRow.agent_id,
                ConversationRow.agent_version,
                ConversationRow.status,
            )  # never the document
            missing = ids - convs.keys()
            convs.update(
                (c.conversation_id, c)
                for c in session.scalars(
                    select(ConversationRow).options(cols).where(ConversationRow.conversation_id.in_(missing))
                ).all()
            )
        rows: list[dict[str, Any]] = []
        for o in outcomes:
            c = convs.get(o.conversation_id)
            if c is None:  # not stored yet: on_stored joins it when the conversation arrives
                continue
            for judge in self.judges.values():
                neg = judge.spec.sampling.negative_outcomes
                if neg is None or not judge.applies(c.agent_id, c.agent_version):
                    continue
                if c.status == "in_progress" and not judge.spec.sampling.judge_in_progress:
                    continue
                if neg.is_negative(o.type, o.value):
                    rows.append(
                        self._row(judge, c.conversation_id, c.revision, c.agent_id, c.agent_version, "outcome", now)
                    )
        unique = {(r["judge"], r["conversation_id"]): r for r in rows}
        self._enqueue(session, list(unique.values()))

    def enqueue_manual(self, session: Session, judge: Judge, conversation_id: str) -> dict[str, Any] | None:
        """Ask for a judgement of the stored conversation now (CLI/API). None if it is queued or judged."""
        c = session.get(ConversationRow, conversation_id)
        if c is None:
            raise LookupError(conversation_id)
        fresh = self._enqueue(
            session,
            [
                self._row(
                    judge, c.conversation_id, c.revision, c.agent_id, c.agent_version, "manual", self._now(session)
                )
            ],
        )
        return fresh[0] if fresh else None
