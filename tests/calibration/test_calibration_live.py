"""Calibration from the live review queue: rows in verdicts and review_labels, on SQLite and Postgres."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import ADMIN, REVIEWER, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.store.models import PairwiseRow, ReviewItemRow, ReviewLabelRow, VerdictRow

JUDGE = "support-generic"


def _verdict(
    cid: str,
    verdict: str,
    version: str = "1",
    revision: int = 1,
    reason: str = "sampled",
    agent_version: str = "v1",
) -> VerdictRow:
    return VerdictRow(
        judge=JUDGE,
        judge_version=version,
        conversation_id=cid,
        revision=revision,
        agent_id="bot",
        agent_version=agent_version,
        verdict=verdict,
        score=None,
        categories=["wrong_action"] if verdict == "fail" else [],
        model="m",
        offline=False,
        prompt_hash="h",
        reason=reason,
    )


def _label(
    cid: str, reviewer: str, label: str, current: bool = True, version: int = 1, revision: int = 1
) -> ReviewLabelRow:
    return ReviewLabelRow(
        conversation_id=cid,
        revision=revision,
        reviewer=reviewer,
        label=label,
        category="wrong_action" if label == "confirmed_failure" else None,
        version=version,
        is_current=current,
    )


def _kappa(tp: int, fn: int, fp: int, tn: int) -> float:
    n = tp + fn + fp + tn
    po = (tp + tn) / n
    pe = ((tp + fn) * (tp + fp) + (fp + tn) * (fn + tn)) / n**2
    return (po - pe) / (1 - pe)


@pytest.fixture
def seeded(db_url: str):  # type: ignore[no-untyped-def]
    rt = build_runtime(
        # the seeded verdicts are the model's: its figures show while the judge runs live
        make_settings(db_url, calibration_min_labels=40, calibration_min_kappa=0.5, judge_mode="live"),
        registry=CollectorRegistry(),
    )
    rng = random.Random(5)
    truth: dict[str, bool] = {}
    judged: dict[str, str] = {}
    sampled: set[str] = set()
    with rt.sessions.begin() as s:
        for i in range(80):
            cid = f"c{i:03d}"
            fail = rng.random() < 0.3
            truth[cid] = fail
            # a judge with sensitivity ~0.8 and specificity ~0.9
            jf = rng.random() < (0.8 if fail else 0.1)
            judged[cid] = "fail" if jf else "pass"
            s.add(_verdict(cid, "pass" if jf else "fail", revision=0))  # superseded by the later revision
            s.add(_verdict(cid, judged[cid], revision=2))
            is_sampled = i % 2 == 0
            if is_sampled:
                sampled.add(cid)
            s.add(ReviewItemRow(conversation_id=cid, agent_id="bot", agent_version="v1", sampled=is_sampled))
            # labels on revision 2, the one the judge's latest verdict is on
            s.add(_label(cid, "rita", "not_a_failure" if fail else "confirmed_failure", current=False, revision=2))
            s.add(_label(cid, "rita", "confirmed_failure" if fail else "not_a_failure", version=2, revision=2))
            if i < 30:  # a second reviewer, who disagrees now and then
                second = fail if i % 7 else not fail
                s.add(_label(cid, "raj", "confirmed_failure" if second else "not_a_failure", revision=2))
        s.add(_label("c-unsure", "rita", "unsure"))
        s.add(_verdict("c-unsure", "fail"))
        # judge version 2 on a few conversations, and unlabelled sampled traffic of another agent version
        for i in range(5):
            s.add(_verdict(f"c{i:03d}", "fail", version="2", revision=2))
        for i in range(200):
            s.add(_verdict(f"u{i}", "fail" if i % 4 == 0 else "pass", agent_version="v2"))
            s.add(_verdict(f"f{i}", "fail", agent_version="v2", reason="flagged"))  # not random: left out
        for first, second in [("a", "a"), ("a", "b"), ("b", "b"), ("b", "a"), ("a", "b"), (None, "a")]:
            s.add(
                PairwiseRow(
                    judge=JUDGE,
                    judge_version="1",
                    model="m",
                    prompt_hash="h",
                    input_hash="i",
                    first_choice=first,
                    second_choice=second,
                    position_bias=first != second,
                    rationales=[],
                    raw_replies=[],
                )
            )
    yield rt, truth, judged, sampled
    rt.close()


def _consensus(truth: dict[str, bool]) -> dict[str, bool]:
    """By hand: rita always, raj on c000..c029; a tie is disputed and left out."""
    out = {}
    for cid, fail in truth.items():
        i = int(cid[1:])
        if i < 30 and i % 7 == 0:
            continue  # rita and raj disagree: tie
        out[cid] = fail
    return out


def test_live_queue_agreement_and_corrected_rates(seeded) -> None:  # type: ignore[no-untyped-def]
    rt, truth, judged, sampled = seeded
    with make_client(rt) as client:
        r = client.get(f"/v1/judges/{JUDGE}/calibration", headers=REVIEWER)
        assert r.status_code == 200, r.text
        body = r.json()
        assert client.get("/v1/judges/nope/calibration", headers=REVIEWER).status_code == 404
        assert client.get(f"/v1/judges/{JUDGE}/calibration").status_code == 401
        overview = client.get("/v1/calibration", headers=REVIEWER).json()

    human = _consensus(truth)
    c = Counter((human[cid], judged[cid] == "fail") for cid in human)
    tp, fn, fp, tn = c[(True, True)], c[(True, False)], c[(False, True)], c[(False, False)]
    v1 = next(v for v in body["versions"] if v["judge_version"] == "1")
    q = v1["review_queue"]
    assert q["agreement"]["confusion"] == {"tp": tp, "fn": fn, "fp": fp, "tn": tn}
    assert q["labels"] == len(human)  # "unsure" and tied conversations are left out
    assert q["agreement"]["kappa"]["value"] == pytest.approx(_kappa(tp, fn, fp, tn))
    kappa_ok = _kappa(tp, fn, fp, tn) >= 0.5
    assert v1["state"] == ("calibrated" if len(human) >= 40 and kappa_ok else "uncalibrated")
    assert body["current_version"] == "1" and body["state"] == v1["state"]

    v2 = next(v for v in body["versions"] if v["judge_version"] == "2")
    assert v2["review_queue"]["labels"] == 4 and v2["state"] == "uncalibrated"  # c000 is disputed
    assert "4 of the 40 labels" in v2["state_reason"]

    # raw rates: only the judge's random sample; corrected with errors measured on sampled items only
    rates = {r["agent_version"]: r for r in v1["rates"]}
    assert rates["v2"]["raw"]["count"] == 50 and rates["v2"]["raw"]["n"] == 200
    assert rates["v2"]["calibrated"] == (v1["state"] == "calibrated")
    ms = Counter((human[cid], judged[cid] == "fail") for cid in human if cid in sampled)
    se = ms[(True, True)] / (ms[(True, True)] + ms[(True, False)])
    sp = ms[(False, False)] / (ms[(False, False)] + ms[(False, True)])
    expected = min(1.0, max(0.0, (0.25 + sp - 1) / (se + sp - 1)))
    assert rates["v2"]["corrected"]["value"] == pytest.approx(expected)
    assert v1["measured_on"].startswith("review queue (sampled")

    pb = v1["position_bias"]
    assert (pb["comparisons"], pb["flips"], pb["unscored"]) == (5, 3, 1)

    # between reviewers: rita and raj on c000..c029, Cohen's kappa by hand
    inter = overview["inter_reviewer"]
    assert inter["method"] == "cohen" and inter["items"] == 30
    pairs = Counter((truth[f"c{i:03d}"], truth[f"c{i:03d}"] if i % 7 else not truth[f"c{i:03d}"]) for i in range(30))
    a, b = pairs[(True, True)], pairs[(False, False)]
    off1, off2 = pairs[(True, False)], pairs[(False, True)]
    assert inter["kappa"]["value"] == pytest.approx(_kappa(a, off1, off2, b))
    assert inter["percent_agreement"]["count"] == a + b
    names = [j["judge"] for j in overview["judges"]]
    assert JUDGE in names and "tau2-airline" in names


def test_fleiss_for_three_reviewers(sqlite_url: str) -> None:
    from vigil.calibration.stats import inter_rater

    labels = ["confirmed_failure", "not_a_failure", "unsure"]
    rng = random.Random(3)
    items = {
        f"i{k}": [(r, rng.choice(labels[:2] if k % 3 else labels)) for r in ("ann", "bob", "cy")] for k in range(25)
    }
    out = inter_rater(items)
    assert out["method"] == "fleiss" and out["raters_per_item"] == 3
    # Fleiss' kappa by hand
    n, m = len(items), 3
    counts = [Counter(lab for _, lab in v) for v in items.values()]
    p_j = [sum(c[lab] for c in counts) / (n * m) for lab in labels]
    p_i = [(sum(x * x for x in c.values()) - m) / (m * (m - 1)) for c in counts]
    p_bar, pe = sum(p_i) / n, sum(p * p for p in p_j)
    assert out["kappa"]["value"] == pytest.approx((p_bar - pe) / (1 - pe))
    assert out["kappa"]["low"] <= out["kappa"]["value"] <= out["kappa"]["high"]


def test_calibrate_endpoint_with_recorded_verdicts(sqlite_url: str) -> None:
    rt = build_runtime(
        make_settings(sqlite_url, calibration_min_labels=4, judge_mode="live"), registry=CollectorRegistry()
    )
    labels = [{"conversation_id": f"x{i}", "human": "fail" if i % 2 else "pass"} for i in range(8)]
    verdicts = [{"conversation_id": f"x{i}", "verdict": "fail" if i % 2 else "pass"} for i in range(8)]
    with make_client(rt) as client:
        body = {"labels": labels, "verdicts": verdicts, "source": "api-set"}
        assert client.post(f"/v1/judges/{JUDGE}/calibration", json=body, headers=REVIEWER).status_code == 403
        r = client.post(f"/v1/judges/{JUDGE}/calibration", json=body, headers=ADMIN)
        assert r.status_code == 200, r.text
        (v,) = r.json()["versions"]
        assert v["judge_version"] == "1" and v["state"] == "calibrated"
        assert v["agreement"]["kappa"]["value"] == pytest.approx(1.0)
        bad = {"labels": [{"conversation_id": "x", "human": "maybe"}], "verdicts": []}
        r = client.post(f"/v1/judges/{JUDGE}/calibration", json=bad, headers=ADMIN)
        assert r.status_code == 422 and "labels:1: human must be fail or pass" in r.json()["detail"]
        # the stored run makes the current version calibrated even without review labels
        got = client.get(f"/v1/judges/{JUDGE}/calibration", headers=REVIEWER).json()
        assert got["state"] == "calibrated"
        assert got["versions"][-1]["labelled_set"]["source"] == "api-set"
    rt.close()


def test_live_pairs_bounded_to_the_newest_labels(seeded) -> None:  # type: ignore[no-untyped-def]
    from vigil.calibration import live

    rt, _truth, _judged, sampled = seeded
    with rt.sessions() as s:
        every = live.live_pairs(s, JUDGE)[JUDGE]
        # labels in id order: per conversation rita's old and current label, then raj's on c000..c029,
        # then c-unsure; the newest 52 current ones are c-unsure's, rita's on c079..c030 and raj's on c029
        bounded = live.live_pairs(s, JUDGE, max_pairs=52)[JUDGE]
        newest = {f"c{i:03d}" for i in range(29, 80)}
        assert {p.conversation_id for p in bounded} == newest  # c029 with both its labels; c-unsure is unsure
        assert bounded == [p for p in every if p.conversation_id in newest]
        # the bound counts only labels that could pair: here of sampled items
        few = live.live_pairs(s, JUDGE, only_sampled=True, max_pairs=5)[JUDGE]
        assert {p.conversation_id for p in few} == {f"c{i:03d}" for i in (70, 72, 74, 76, 78)} <= sampled
        assert live.live_pairs(s, JUDGE, max_pairs=len(every) + 100)[JUDGE] == every


def test_calibration_reads_only_the_newest_pairs(sqlite_url: str) -> None:
    rt = build_runtime(
        make_settings(sqlite_url, judge_mode="live", calibration_max_pairs=3, calibration_correction_labels="all"),
        registry=CollectorRegistry(),
    )
    try:
        with rt.sessions.begin() as s:
            for i in range(8):  # older conversations the judge got right, newer ones it got wrong
                s.add(_verdict(f"c{i}", "pass" if i < 5 else "fail"))
                s.add(_label(f"c{i}", "rita", "not_a_failure"))
        with make_client(rt) as client:
            body = client.get(f"/v1/judges/{JUDGE}/calibration", headers=REVIEWER).json()
        q = next(v for v in body["versions"] if v["judge_version"] == "1")["review_queue"]
        assert q["labels"] == 3
        assert q["agreement"]["confusion"] == {"tp": 0, "fn": 0, "fp": 3, "tn": 0}
    finally:
        rt.close()


def test_a_label_pairs_only_with_a_verdict_on_its_revision(sqlite_url: str) -> None:
    """A label on a newer revision is not scored against the judge's verdict on an older one (other text),
    nor does it take a place in the bounded walk until the judge has judged its revision."""
    from vigil.calibration import live

    rt = build_runtime(make_settings(sqlite_url, judge_mode="live"), registry=CollectorRegistry())
    try:
        with rt.sessions.begin() as s:
            s.add(_verdict("old", "pass", revision=1))  # revision 1 was fine; revision 2 is not judged yet
            s.add(_label("old", "rita", "confirmed_failure", revision=2))
            s.add(_verdict("both", "pass", revision=1))  # judged on both: the label's revision counts
            s.add(_verdict("both", "fail", revision=2))
            s.add(_label("both", "rita", "confirmed_failure", revision=2))
            s.add(_verdict("newer", "fail", revision=3))  # a verdict on a revision nobody labelled yet
            s.add(_label("newer", "rita", "not_a_failure", revision=2))
        with rt.sessions() as s:
            for bound in (None, 10):
                pairs = live.live_pairs(s, JUDGE, max_pairs=bound)[JUDGE]
                assert [(p.conversation_id, p.human_fail, p.verdict) for p in pairs] == [("both", True, "fail")]
            _, window = live.live_pairs_window(s, JUDGE, max_pairs=10)
            assert window is not None and window.considered == 1
    finally:
        rt.close()


def test_an_open_double_review_gives_no_pair_until_it_is_done(sqlite_url: str) -> None:
    """One label of a double review still open is not a settled human verdict, and counting it would show
    its category to the second reviewer in the calibration pages while the review is blind to them."""
    from vigil.calibration import live

    rt = build_runtime(make_settings(sqlite_url, judge_mode="live"), registry=CollectorRegistry())
    try:
        with rt.sessions.begin() as s:
            for cid, required, status in [("single", 1, "done"), ("double", 2, "open"), ("settled", 2, "done")]:
                s.add(ReviewItemRow(conversation_id=cid, required_reviews=required, status=status))
                s.add(_verdict(cid, "fail"))
            s.add(_label("single", "rita", "confirmed_failure"))
            s.add(_label("double", "rita", "confirmed_failure"))
            s.add(_label("settled", "rita", "confirmed_failure"))
            s.add(_label("settled", "raj", "confirmed_failure"))
        with rt.sessions() as s:
            for bound in (None, 10):
                pairs = live.live_pairs(s, JUDGE, max_pairs=bound)[JUDGE]
                assert sorted(p.conversation_id for p in pairs) == ["settled", "single"], bound
        with make_client(rt) as c:
            got = c.get(f"/v1/judges/{JUDGE}/calibration", headers=REVIEWER).json()
            q = got["versions"][0]["review_queue"]
            assert q["labels"] == 2 and q["categories"]["by_category"] == {"wrong_action": {"matched": 2, "n": 2}}
    finally:
        rt.close()
