"""Deterministic sampling, targeted always-judge rules and the per-version hourly minimum."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import make_settings
from tests.support.judge_fakes import judge_dir
from vigil.app.runtime import build_runtime
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.judge.models import JudgeRequestRow
from vigil.judge.sampling import is_sampled, sample_point
from vigil.judge.wiring import wire
from vigil.schema import Conversation
from vigil.store.models import OutcomeRow

IDS = [f"conv-{i}" for i in range(100_000)]


def test_rate_within_a_third_of_a_point_and_the_same_ids_every_run() -> None:
    chosen = [i for i in IDS if is_sampled(i, "support-generic-v1", 0.02)]
    assert abs(len(chosen) / len(IDS) - 0.02) < 0.003
    assert chosen == [i for i in IDS if is_sampled(i, "support-generic-v1", 0.02)]
    # fixed by the algorithm, not by this process: a replica or a replay next year picks these same ids
    assert len(chosen) == 1946 and chosen[:3] == ["conv-79", "conv-107", "conv-152"]
    other_salt = {i for i in IDS if is_sampled(i, "support-generic-v2", 0.02)}
    assert len(other_salt & set(chosen)) < 200  # a new salt version draws a new, independent sample
    # raising the rate keeps every id already chosen (points are fixed, the threshold moves)
    assert set(chosen) <= {i for i in IDS if is_sampled(i, "support-generic-v1", 0.05)}
    rng = random.Random(7)
    uuids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(100_000)]
    assert abs(sum(is_sampled(u, "tau2-airline-v1", 0.02) for u in uuids) / len(uuids) - 0.02) < 0.003
    assert 0 <= min(sample_point(i, "s") for i in IDS[:1000]) < max(sample_point(i, "s") for i in IDS[:1000]) < 1


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 3, 2, 10, 5, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def _runtime(tmp_path: Path, settings: dict[str, object] | None = None, **judge):  # type: ignore[no-untyped-def]
    jd = judge_dir(tmp_path / "judges", **judge)
    rt = build_runtime(
        make_settings(f"sqlite:///{tmp_path / 'v.db'}", judges_dir=str(jd), judge_mode="offline", **(settings or {})),
        registry=CollectorRegistry(),
    )
    rt.roles = frozenset({"api"})
    stage = wire(rt)
    clock = Clock()
    stage.sampler.clock = clock
    return rt, stage, clock


def _convs(n: int, versions: str = "v1:0.0", seed: int = 3, **over: object) -> list[Conversation]:
    return [Conversation.model_validate({**c, **over}) for c in Simulator(parse_versions(versions), seed).stream(n)]


def _requests(rt) -> list[JudgeRequestRow]:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return list(s.scalars(select(JudgeRequestRow).order_by(JudgeRequestRow.id)).all())


def test_sampler_enqueues_sampled_flagged_and_negative_outcomes_once(tmp_path: Path) -> None:
    rt, stage, _ = _runtime(tmp_path, sampling={"rate": 0.3, "always_judge_severity": "high"})
    clean = _convs(200)
    rt.pipeline.process(clean, "test")
    sampled = {c.conversation_id for c in clean if is_sampled(c.conversation_id, "t-v1", 0.3)}
    reqs = _requests(rt)
    assert {r.conversation_id for r in reqs} == sampled and {r.reason for r in reqs} == {"sampled"}
    # redelivery changes nothing
    rt.pipeline.process(clean, "test")
    assert len(_requests(rt)) == len(sampled)
    # a conversation with a high-severity finding is always judged
    bad = [c for c in _convs(60, "v1:1.0", seed=5) if not is_sampled(c.conversation_id, "t-v1", 0.3)]
    rt.pipeline.process(bad, "test")
    flagged = {r.conversation_id for r in _requests(rt) if r.reason == "flagged"}
    assert flagged and flagged <= {c.conversation_id for c in bad}
    with rt.sessions() as s:
        from vigil.store.models import ConversationRow

        severities = dict(s.execute(select(ConversationRow.conversation_id, ConversationRow.max_severity)).all())
    assert all(severities[cid] in ("high", "critical") for cid in flagged)
    # inline negative outcome (a benchmark reward of 0) is always judged; an in-progress one is not yet
    unsampled = [c for c in _convs(50, seed=9) if not is_sampled(c.conversation_id, "t-v1", 0.3)]

    def with_(c: Conversation, **over: object) -> Conversation:
        return Conversation.model_validate({**c.model_dump(exclude_none=True), **over})

    lost = with_(unsampled[0], outcomes=[{"type": "task_success", "value": 0.0}])
    won = with_(unsampled[1], outcomes=[{"type": "task_success", "value": 1.0}])
    growing = with_(unsampled[2], status="in_progress", outcomes=[{"type": "task_success", "value": 0.0}])
    rt.pipeline.process([lost, won, growing], "test")
    by_id = {r.conversation_id: r.reason for r in _requests(rt)}
    assert by_id.get(lost.conversation_id) == "outcome"
    assert won.conversation_id not in by_id and growing.conversation_id not in by_id
    text = rt.metrics.registry.get_sample_value
    assert text(
        "vigil_judge_sampled_total",
        {
            "judge": "tj",
            "judge_version": "3",
            "agent": "support-bot",
            "agent_version": "v1",
            "reason": "sampled",
        },
    ) == len(sampled)
    assert (
        text(
            "vigil_judge_eligible_total",
            {"judge": "tj", "judge_version": "3", "agent": "support-bot", "agent_version": "v1"},
        )
        == 200 + len(bad) + 2
    )


def test_newer_revision_supersedes_a_pending_request(tmp_path: Path) -> None:
    import asyncio

    from vigil.judge.worker import JudgeWorker
    from vigil.store.models import VerdictRow

    rt, stage, _ = _runtime(tmp_path, sampling={"rate": 1.0})
    conv = _convs(1)[0]
    rt.pipeline.process([conv], "test")
    rt.pipeline.process([conv.model_copy(update={"revision": 7})], "test")
    assert [(r.revision, r.status) for r in _requests(rt)] == [
        (conv.effective_revision, "superseded"),  # at once, not only when a worker claims it
        (7, "pending"),
    ]
    asyncio.run(JudgeWorker(stage.engine).run_until_idle(20))
    assert [(r.revision, r.status) for r in _requests(rt)] == [
        (conv.effective_revision, "superseded"),
        (7, "done"),
    ]
    with rt.sessions() as s:
        assert [v.revision for v in s.scalars(select(VerdictRow)).all()] == [7]


def test_outcome_listener_enqueues_on_negative_outcome_and_early_outcomes_join(tmp_path: Path) -> None:
    rt, stage, clock = _runtime(tmp_path, sampling={"rate": 0.0})
    first, second, third = _convs(3)
    rt.pipeline.process([first], "test")
    assert _requests(rt) == []
    assert stage.sampler.on_outcomes in rt.hooks.outcome_listeners
    with rt.sessions.begin() as s:
        rows = [
            OutcomeRow(
                idempotency_key="k1",
                conversation_id=first.conversation_id,
                type="thumbs_up",
                value=1,
                occurred_at=clock.now,
            ),
            OutcomeRow(
                idempotency_key="k2",
                conversation_id=first.conversation_id,
                type="escalation",
                value=1,
                occurred_at=clock.now,
            ),
            OutcomeRow(
                idempotency_key="k3",
                conversation_id=second.conversation_id,
                type="escalation",
                value=1,
                occurred_at=clock.now,
            ),
        ]
        s.add_all(rows)
        s.flush()
        for listener in rt.hooks.outcome_listeners:
            listener(s, rows)
    assert [(r.conversation_id, r.reason) for r in _requests(rt)] == [(first.conversation_id, "outcome")]
    # the second conversation's outcome came first: it is joined when the conversation is stored
    rt.pipeline.process([second, third], "test")
    assert [(r.conversation_id, r.reason) for r in _requests(rt)][1:] == [(second.conversation_id, "outcome")]


def test_minimum_judged_per_agent_version_per_hour(tmp_path: Path) -> None:
    rt, _, clock = _runtime(
        tmp_path, sampling={"rate": 0.0, "min_per_agent_version_per_hour": 3, "always_judge_severity": None}
    )
    rt.pipeline.process(_convs(10, "v1:0.0,v2-canary:0.0", seed=1), "test")
    per_version: dict[str, int] = {}
    for r in _requests(rt):
        assert r.reason == "min_per_hour"
        per_version[r.agent_version] = per_version.get(r.agent_version, 0) + 1
    assert per_version == {"v1": 3, "v2-canary": 3}
    rt.pipeline.process(_convs(10, "v1:0.0", seed=2), "test")
    assert len(_requests(rt)) == 6  # this hour's minimum is met
    clock.now += timedelta(hours=1)
    rt.pipeline.process(_convs(10, "v1:0.0", seed=4), "test")
    assert len(_requests(rt)) == 9


def _distinct_versions(n: int, seed: int) -> list[Conversation]:
    return [c.model_copy(update={"agent_version": f"build-{seed}-{i}"}) for i, c in enumerate(_convs(n, seed=seed))]


def test_distinct_versions_cost_the_sample_rate_not_one_request_each(tmp_path: Path) -> None:
    """3,000 conversations, each of its own agent version: about 2% are judged, plus a bounded floor."""
    sampling = {"rate": 0.02, "min_per_agent_version_per_hour": 5, "always_judge_severity": None}
    convs = _distinct_versions(3000, seed=11)
    sampled = sum(is_sampled(c.conversation_id, "t-v1", 0.02) for c in convs)
    assert 40 < sampled < 80

    def floor_requests(name: str, **settings: object) -> int:
        rt, _, _ = _runtime(tmp_path / name, settings=settings, sampling={**sampling, "negative_outcomes": None})
        for i in range(0, len(convs), 500):
            rt.pipeline.process(convs[i : i + 500], "test")
        reasons = [r.reason for r in _requests(rt)]
        assert reasons.count("sampled") == sampled
        assert set(reasons) <= {"sampled", "min_per_hour"}
        rt.close()
        return reasons.count("min_per_hour")

    # the floor goes to versions within the label budget (50 by default), not to all 3,000
    assert 40 <= floor_requests("budget", judge_min_versions=10_000, judge_min_per_hour_cap=10_000) <= 50
    # or to the first N versions of the hour
    assert 5 <= floor_requests("top", judge_min_versions=10) <= 10
    # and never above the hourly cap, however large the label budget
    assert floor_requests("cap", max_label_values=10_000, judge_min_versions=10_000, judge_min_per_hour_cap=25) == 25


def test_a_version_within_the_budget_still_gets_its_minimum_among_a_flood(tmp_path: Path) -> None:
    sampling = {"rate": 0.0, "min_per_agent_version_per_hour": 3, "always_judge_severity": None}
    rt, _, _ = _runtime(tmp_path, settings={"judge_min_versions": 5}, sampling=sampling)
    rt.pipeline.process(_convs(10, "v1:0.0", seed=1), "test")  # the long-lived version arrives first
    rt.pipeline.process(_distinct_versions(500, seed=2), "test")
    rt.pipeline.process(_convs(10, "v1:0.0", seed=3), "test")
    per_version: dict[str, int] = {}
    for r in _requests(rt):
        per_version[r.agent_version] = per_version.get(r.agent_version, 0) + 1
    assert per_version.pop("v1") == 3
    assert len(per_version) == 4 and set(per_version.values()) == {1}  # four more versions, one conversation each


def _metric(rt, name: str, **labels: str) -> float:  # type: ignore[no-untyped-def]
    base = {"judge": "tj", "judge_version": "3", "agent": "support-bot", "agent_version": "v1"}
    return rt.metrics.registry.get_sample_value(name, {**base, **labels}) or 0.0


def test_revisions_of_one_conversation_take_one_hourly_slot_and_count_once(tmp_path: Path) -> None:
    import asyncio

    from vigil.judge.worker import JudgeWorker

    sampling = {"rate": 0.0, "min_per_agent_version_per_hour": 3, "always_judge_severity": None}
    rt, stage, clock = _runtime(tmp_path, sampling={**sampling, "negative_outcomes": None})
    first, *others = _convs(6)
    for revision in (1, 2, 3):
        rt.pipeline.process([first.model_copy(update={"revision": revision})], "test")
    rt.pipeline.process(others, "test")
    got = [(r.conversation_id, r.revision, r.status, r.reason) for r in _requests(rt)]
    a, b, c = first.conversation_id, others[0].conversation_id, others[1].conversation_id
    assert got == [
        (a, 1, "superseded", "min_per_hour"),
        (a, 2, "superseded", "min_per_hour"),
        (a, 3, "pending", "min_per_hour"),
        (b, others[0].effective_revision, "pending", "min_per_hour"),
        (c, others[1].effective_revision, "pending", "min_per_hour"),
    ]  # three conversations fill the three slots, the first one's revisions take one
    assert _metric(rt, "vigil_judge_eligible_total") == 6
    assert _metric(rt, "vigil_judge_sampled_total", reason="min_per_hour") == 3
    # a restarted sampler counts this hour's conversations, not requests, from the database
    rt2, stage2, clock2 = _runtime(tmp_path, sampling={**sampling, "negative_outcomes": None})
    clock2.now = clock.now
    rt2.pipeline.process([first.model_copy(update={"revision": 4}), *_convs(2, seed=8)], "test")
    new = [(r.conversation_id, r.revision) for r in _requests(rt2)][5:]
    assert new == [(a, 4)]
    # judged counts the conversation once, however many of its revisions get a verdict
    asyncio.run(JudgeWorker(stage2.engine).run_until_idle(20))
    rt2.pipeline.process([first.model_copy(update={"revision": 5})], "test")
    asyncio.run(JudgeWorker(stage2.engine).run_until_idle(20))
    assert (
        _metric(rt2, "vigil_judge_verdicts_total", verdict="pass", offline="true")
        + _metric(rt2, "vigil_judge_verdicts_total", verdict="fail", offline="true")
        == 4
    )  # a (revision 4), b, c, then a again (revision 5)
    assert _metric(rt2, "vigil_judge_judged_total") == 3


def test_in_progress_revisions_then_the_finished_one_count_once(tmp_path: Path) -> None:
    rt, _, _ = _runtime(tmp_path, sampling={"rate": 1.0})
    conv = _convs(1)[0]
    for revision, status in ((1, "in_progress"), (2, "in_progress"), (3, "finished")):
        rt.pipeline.process([conv.model_copy(update={"revision": revision, "status": status})], "test")
    assert [(r.revision, r.status) for r in _requests(rt)] == [(3, "pending")]
    assert _metric(rt, "vigil_judge_eligible_total") == 1
    assert _metric(rt, "vigil_judge_sampled_total", reason="sampled") == 1
    # a later revision of the chosen conversation is judged too, without counting it again
    rt.pipeline.process([conv.model_copy(update={"revision": 4, "status": "finished"})], "test")
    assert [(r.revision, r.status) for r in _requests(rt)] == [(3, "superseded"), (4, "pending")]
    assert _metric(rt, "vigil_judge_eligible_total") == 1
    assert _metric(rt, "vigil_judge_sampled_total", reason="sampled") == 1
