"""The flagging policy and the flagger: findings, judge verdicts, outcomes, sampling, priorities."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from tests.support.review import review_runtime, simulated, store
from vigil.errors import ConfigError
from vigil.review import queue
from vigil.review.models import ReviewAuditRow, ReviewReasonRow
from vigil.review.policy import DEFAULT_POLICY, FlaggingPolicy
from vigil.review.stage import ReviewStage
from vigil.store.models import OutcomeRow, ReviewItemRow, VerdictRow


def _item(rt, cid: str) -> ReviewItemRow | None:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return s.scalar(select(ReviewItemRow).where(ReviewItemRow.conversation_id == cid))


def _reasons(rt, cid: str) -> set[tuple[str, str]]:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return {
            (r.kind, r.key) for r in s.scalars(select(ReviewReasonRow).where(ReviewReasonRow.conversation_id == cid))
        }


def _verdict(
    conv: dict,
    verdict: str,
    score: float | None = None,
    offline: bool = False,
    judge: str = "support-generic",
) -> VerdictRow:
    return VerdictRow(
        judge=judge,
        judge_version="1",
        conversation_id=conv["conversation_id"],
        revision=1,
        agent_id=conv["agent_id"],
        agent_version=conv["agent_version"],
        verdict=verdict,
        score=score,
        categories=[],
        rationale="the agent cancelled a delivered order",
        unscored_reason=None,
        model="scripted",
        offline=offline,
        prompt_hash="0" * 64,
        raw_reply="{}",
        attempts=1,
        reason="sampled",
    )


def _outcome(cid: str, type_: str, value: float = 1.0, at: datetime | None = None) -> OutcomeRow:
    return OutcomeRow(
        idempotency_key=f"{cid}:{type_}",
        conversation_id=cid,
        type=type_,
        value=value,
        occurred_at=at or datetime.now(UTC),
        source="test",
    )


def _stored_rows(rt, rows):  # type: ignore[no-untyped-def]
    """Insert rows the way the judge and outcome stages do, then call the listeners in that transaction."""
    with rt.sessions.begin() as s:
        s.add_all(rows)
        s.flush()
        listeners = rt.hooks.verdict_listeners if isinstance(rows[0], VerdictRow) else rt.hooks.outcome_listeners
        for fn in listeners:
            fn(s, rows)


def test_findings_enter_once_and_later_signals_raise_priority(rt) -> None:
    convs = simulated(60, "v1:0.6", seed=2)
    store(rt, convs)
    cancel = next(c for c in convs if c["metadata"]["simulated_defect"] == "cancel_delivered")
    clean = next(
        c for c in convs if c["metadata"]["simulated_defect"] is None and _item(rt, c["conversation_id"]) is None
    )
    cid = cancel["conversation_id"]
    item = _item(rt, cid)
    assert item is not None and item.priority == 60 and item.agent_version == "v1"
    assert ("finding", "no-cancel-delivered-order") in _reasons(rt, cid)
    store(rt, convs)  # a replay adds nothing
    assert _item(rt, cid).priority == 60

    _stored_rows(
        rt,
        [
            _verdict(cancel, "fail", 0.1),
            _verdict(clean, "pass", 0.3),
            _verdict(convs[-1], "pass", 0.9, judge="other"),
        ],
    )
    assert _item(rt, cid).priority == 60 + 70
    assert _reasons(rt, cid) >= {("finding", "no-cancel-delivered-order"), ("judge_fail", "support-generic")}
    low = _item(rt, clean["conversation_id"])
    assert low is not None and low.priority == 40
    assert _reasons(rt, clean["conversation_id"]) == {("judge_low_score", "support-generic")}
    assert _item(rt, convs[-1]["conversation_id"]) is None or ("judge_fail", "other") not in _reasons(
        rt, convs[-1]["conversation_id"]
    )

    _stored_rows(rt, [_outcome(cid, "escalation"), _outcome(cid, "thumbs_up")])
    assert _item(rt, cid).priority == 60 + 70 + 50
    assert ("outcome", "escalation") in _reasons(rt, cid) and ("outcome", "thumbs_up") not in _reasons(rt, cid)
    with rt.sessions() as s:
        actions = [
            a.action
            for a in s.scalars(
                select(ReviewAuditRow).where(ReviewAuditRow.conversation_id == cid).order_by(ReviewAuditRow.id)
            )
        ]
    assert actions == ["enqueued", "reason_added", "reason_added"]


def test_outcome_before_its_conversation_waits_then_becomes_claimable(rt) -> None:
    conv = next(c for c in simulated(40, "v1:0.0", seed=4))
    cid = conv["conversation_id"]
    _stored_rows(rt, [_outcome(cid, "refund_reversal"), _outcome(cid, "task_success", 0.0)])
    item = _item(rt, cid)
    assert item is not None and item.agent_id is None and item.priority == 60 + 40
    with rt.sessions.begin() as s:
        assert queue.claim_next(s, "rita", 600) is None
    store(rt, [conv])
    assert _item(rt, cid).agent_id == "support-bot"
    with rt.sessions.begin() as s:
        assert queue.claim_next(s, "rita", 600) == cid


def test_offline_verdicts_can_be_ignored(db_url, tmp_path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("judge: {include_offline: false}\nsample: {rate: 0}\n")
    rt = review_runtime(db_url, review_policy=str(policy))
    try:
        conv = simulated(1, "v1:0.0", seed=9)[0]
        store(rt, [conv])
        _stored_rows(rt, [_verdict(conv, "fail", offline=True)])
        assert _item(rt, conv["conversation_id"]) is None
        _stored_rows(rt, [_verdict(conv, "fail", offline=False, judge="llm")])
        assert _reasons(rt, conv["conversation_id"]) == {("judge_fail", "llm")}
    finally:
        rt.close()


def test_sampling_is_deterministic_and_near_its_rate() -> None:
    policy = FlaggingPolicy.load()
    ids = [f"conv-{i}" for i in range(20_000)]
    picked = [i for i in ids if policy.sampled(i)]
    again = FlaggingPolicy.load(DEFAULT_POLICY)
    assert picked == [i for i in ids if again.sampled(i)]
    assert 0.015 < len(picked) / len(ids) < 0.025
    resalted = policy.model_copy(update={"sample": policy.sample.model_copy(update={"salt": "review-sample-v2"})})
    assert [i for i in ids if resalted.sampled(i)] != picked
    multi = sum(policy.reviewers_for(i) == 2 for i in ids) / len(ids)
    assert 0.08 < multi < 0.12


def test_unflagged_conversations_are_sampled(sqlite_url) -> None:
    rt = review_runtime(sqlite_url)
    try:
        convs = simulated(300, "v1:0.0", seed=8)
        store(rt, convs)
        policy = rt.get(ReviewStage).policy
        expected = {c["conversation_id"] for c in convs if policy.sampled(c["conversation_id"])}
        with rt.sessions() as s:
            sampled = set(s.scalars(select(ReviewItemRow.conversation_id).where(ReviewItemRow.sampled.is_(True))))
        assert sampled == expected and sampled
    finally:
        rt.close()


def test_sample_is_drawn_from_flagged_and_unflagged_alike(db_url, tmp_path) -> None:
    """The sampled items are a uniform sample of traffic, so labels on them measure a judge without bias."""
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text("sample: {rate: 0.3}\nmulti_review: {share: 0}\n")
    rt = review_runtime(db_url, review_policy=str(policy_file))
    try:
        convs = simulated(300, "v1:0.6", seed=12)
        store(rt, convs)
        policy = rt.get(ReviewStage).policy
        with rt.sessions() as s:
            items = {i.conversation_id: i for i in s.scalars(select(ReviewItemRow))}
            reasons: dict[str, set[str]] = {}
            for r in s.scalars(select(ReviewReasonRow)):
                reasons.setdefault(r.conversation_id, set()).add(r.kind)
        flagged = {cid for cid, kinds in reasons.items() if "finding" in kinds}
        ids = [c["conversation_id"] for c in convs]
        unflagged = [cid for cid in ids if cid not in flagged]
        assert len(flagged) > 80 and len(unflagged) > 80
        drawn = {cid for cid in ids if policy.sampled(cid)}
        assert {cid for cid, i in items.items() if i.sampled} == drawn
        for group in (flagged, unflagged):
            share = sum(cid in drawn for cid in group) / len(group)
            assert 0.15 < share < 0.45, share  # 0.3 give or take 3.5 standard errors
        both = sorted(flagged & drawn)
        assert both and all(reasons[cid] == {"finding", "sample"} for cid in both)
    finally:
        rt.close()


def test_an_item_flagged_first_becomes_sampled_when_its_conversation_is_drawn(db_url, tmp_path) -> None:
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text("sample: {rate: 1.0}\noutcomes: {escalation: 50}\n")
    rt = review_runtime(db_url, review_policy=str(policy_file))
    try:
        conv = simulated(1, "v1:0.0", seed=13)[0]
        cid = conv["conversation_id"]
        _stored_rows(rt, [_outcome(cid, "escalation")])
        assert _item(rt, cid).sampled is False
        store(rt, [conv])
        item = _item(rt, cid)
        assert item.sampled is True and item.priority == 50 + 5
        assert _reasons(rt, cid) == {("outcome", "escalation"), ("sample", "review-sample-v1")}
    finally:
        rt.close()


def test_outcomes_outside_the_attribution_window_do_not_flag(db_url, tmp_path) -> None:
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text("sample: {rate: 0}\noutcomes: {escalation: 50, thumbs_down: 30, refund_reversal: 60}\n")
    rt = review_runtime(db_url, review_policy=str(policy_file), outcome_attribution_window_hours=24)
    try:
        convs = simulated(40, "v1:0.0", seed=14)
        stored, late_first, late_with_verdict, early_first = convs[0], convs[1], convs[2], convs[3]
        store(rt, [stored])
        end = datetime.fromisoformat(stored["ended_at"])
        _stored_rows(rt, [_outcome(stored["conversation_id"], "escalation", at=end + timedelta(hours=30))])
        assert _item(rt, stored["conversation_id"]) is None
        _stored_rows(rt, [_outcome(stored["conversation_id"], "thumbs_down", at=end + timedelta(hours=2))])
        assert _reasons(rt, stored["conversation_id"]) == {("outcome", "thumbs_down")}

        # outcomes before their conversation: the item waits, then the window decides
        for c, hours in ((late_first, 30), (late_with_verdict, 30), (early_first, 1)):
            when = datetime.fromisoformat(c["ended_at"]) + timedelta(hours=hours)
            _stored_rows(rt, [_outcome(c["conversation_id"], "refund_reversal", at=when)])
            assert _item(rt, c["conversation_id"]).agent_id is None
        _stored_rows(rt, [_verdict(late_with_verdict, "fail")])  # a second reason that stays
        store(rt, [late_first, late_with_verdict, early_first])
        assert _item(rt, late_first["conversation_id"]) is None
        kept = _item(rt, late_with_verdict["conversation_id"])
        assert kept is not None and kept.priority == 70
        assert _reasons(rt, late_with_verdict["conversation_id"]) == {("judge_fail", "support-generic")}
        assert _item(rt, early_first["conversation_id"]).priority == 60
        with rt.sessions() as s:
            actions = {
                (a.conversation_id, a.action)
                for a in s.scalars(
                    select(ReviewAuditRow).where(ReviewAuditRow.action.in_(["dropped", "reason_dropped"]))
                )
            }
        assert actions == {
            (late_first["conversation_id"], "dropped"),
            (late_with_verdict["conversation_id"], "reason_dropped"),
        }
    finally:
        rt.close()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("findings: {severity: {urgent: 3}}", "findings.severity"),
        ("sample: {rate: 2}", "sample.rate"),
        ("nonsense: 1", "nonsense"),
        ("taxonomy: {}", "taxonomy"),
        ("outcomes: [1, 2", "not valid YAML"),
    ],
)
def test_bad_policy_files_name_the_field(tmp_path, text, message) -> None:
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        FlaggingPolicy.load(p)
    assert str(p) in str(err.value) and message in str(err.value)
    with pytest.raises(ConfigError, match="No such file"):
        FlaggingPolicy.load(tmp_path / "missing.yaml")


def test_policy_weights() -> None:
    policy = FlaggingPolicy.load()
    findings = [
        {"rule_id": "escalated", "severity": "info", "message": "handed off", "details": {}},
        {"rule_id": "pii-in-reply", "severity": "critical", "message": "email", "details": {}},
        {"rule_id": "pii-in-reply", "severity": "critical", "message": "phone", "details": {}},
        {"rule_id": "broken", "severity": "high", "message": "boom", "details": {"rule_error": True}},
        {"rule_id": "budget", "severity": "low", "message": "over", "details": {}},
    ]
    assert [(r.kind, r.key, r.weight) for r in policy.finding_reasons(findings)] == [("finding", "pii-in-reply", 100)]
    assert policy.outcome_reasons("task_success", 1.0) == []
    assert policy.outcome_reasons("task_success", 0.5)[0].weight == 40
    assert policy.outcome_reasons("thumbs_down", 0) == [] and policy.outcome_reasons("unknown", 1) == []
    assert policy.verdict_reasons("j", "unscored", None, False) == []
    assert [(r.kind, r.key) for r in policy.verdict_reasons("j", "fail", 0.0, False)] == [("judge_fail", "j")]
    offline = policy.verdict_reasons("j", "fail", 0.0, True) + policy.verdict_reasons("j", "pass", 0.1, True)
    assert [(r.kind, r.key) for r in offline] == [("judge_fail", "j:offline"), ("judge_low_score", "j:offline")]
