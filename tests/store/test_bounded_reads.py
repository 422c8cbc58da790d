"""Reads bounded to the newest rows give what a from-scratch computation over those rows gives (SQLite and
Postgres): reviewers' agreement on the conversations of the newest N current labels."""

from __future__ import annotations

import random
from collections import defaultdict

from sqlalchemy import select

from vigil.store import db, reads
from vigil.store.models import ReviewLabelRow


def _labels(url: str) -> None:
    rng = random.Random(11)
    db.upgrade(url)
    sessions = db.make_sessionmaker(db.make_engine(url))
    with sessions.begin() as s:
        for k in range(60):
            cid = f"c{k:03d}"
            for reviewer in rng.sample(["ana", "bo", "cy"], rng.choice([1, 1, 2, 3])):
                kinds = ["confirmed_failure", "not_a_failure", "unsure"]
                relabelled = rng.random() < 0.3  # the first answer is then no longer current
                if relabelled:
                    s.add(ReviewLabelRow(conversation_id=cid, revision=1, reviewer=reviewer, label=rng.choice(kinds),
                                         version=1, is_current=False))  # fmt: skip
                s.add(ReviewLabelRow(conversation_id=cid, revision=1, reviewer=reviewer, label=rng.choice(kinds),
                                     version=2 if relabelled else 1, is_current=True))  # fmt: skip
                s.flush()  # ids follow the order written


def test_labels_of_newest_match_a_scan_of_every_label(db_url: str) -> None:
    _labels(db_url)
    sessions = db.make_sessionmaker(db.make_engine(db_url))
    with sessions() as s:
        rows = s.execute(
            select(ReviewLabelRow.id, ReviewLabelRow.conversation_id, ReviewLabelRow.reviewer, ReviewLabelRow.label)
            .where(ReviewLabelRow.is_current.is_(True))
            .order_by(ReviewLabelRow.id)
        ).all()
        every: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for _id, cid, reviewer, label in rows:
            every[cid].append((reviewer, label))
        assert reads.labels_of_newest(s, 10_000) == dict(every)
        for n in (1, 7, 25):
            newest = {cid for _id, cid, _r, _l in sorted(rows, reverse=True)[:n]}
            got = reads.labels_of_newest(s, n)
            assert set(got) == newest  # the conversations of the newest n labels ...
            assert got == {cid: every[cid] for cid in newest}  # ... with every current label of each
        assert any(len(v) >= 2 for v in reads.labels_of_newest(s, 25).values())


def test_among_matches_more_ids_than_a_statement_takes_parameters(db_url) -> None:
    """`among` with 40,000 ids (more than SQLite's 32,766 parameters a statement) finds exactly the stored ones."""
    from sqlalchemy import select

    from vigil.store.db import among, make_engine, make_sessionmaker, upgrade, utcnow
    from vigil.store.models import OutcomeRow

    upgrade(db_url)
    sessions = make_sessionmaker(make_engine(db_url))
    with sessions.begin() as s:
        s.add_all(
            OutcomeRow(idempotency_key=f"k{i}", conversation_id=f"c{i}", type="escalation", occurred_at=utcnow())
            for i in range(5)
        )
    ids = [f"c{i}" for i in range(0, 40_000, 2)] + [f"other{i}" for i in range(20_000)]
    with sessions() as s:
        found = s.scalars(select(OutcomeRow.conversation_id).where(among(s, OutcomeRow.conversation_id, ids)))
        assert sorted(found) == ["c0", "c2", "c4"]
