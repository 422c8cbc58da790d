"""Calibration against real judge-vs-human data: LLMBar's GPT-4 and ChatGPT outputs with gold labels.

Each LLMBar item asks which of two outputs follows the instruction better. We frame it as a binary
verdict on output 1: "fail" when output 1 is the worse one. The human (gold) verdict is ``label == 2``;
the judge's is its winner with the outputs in their original order (``swap = False``). Swapped-order
results give the position-bias rate. Every figure is cross-checked against counts done here by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import orjson
import pytest

from tests.support.services import shared_data
from vigil.calibration.calibrate import pairs_from_verdicts
from vigil.calibration.labelsets import load_labels, load_pairwise, load_verdicts
from vigil.calibration.report import Thresholds, report
from vigil.calibration.stats import position_bias

EVALUATORS = ["GPT-4/Vanilla", "GPT-4/CoT", "ChatGPT/Vanilla", "ChatGPT/CoT"]
SUBSETS = ["Natural", "Adversarial/Neighbor"]


def _results(subset: str, evaluator: str) -> tuple[list[dict], dict]:
    parts = [*subset.split("/"), "evaluators", *evaluator.split("/")]
    base = shared_data("judge_human", "llmbar", "LLMBar", *parts)
    return json.loads((base / "result.json").read_text()), json.loads((base / "statistics.json").read_text())


def _write_sets(tmp: Path, rows: list[dict]) -> tuple[Path, Path, Path]:
    labels, verdicts, pairwise = tmp / "labels.jsonl", tmp / "verdicts.jsonl", tmp / "pairwise.jsonl"
    with labels.open("wb") as lf, verdicts.open("wb") as vf, pairwise.open("wb") as pf:
        for i, row in enumerate(rows):
            cid = f"llmbar-{i}"
            res = row["results"][0]
            w_orig, w_swap = res["swap = False"]["winner"], res["swap = True"]["winner"]
            human = "fail" if int(row["label"]) == 2 else "pass"
            lf.write(orjson.dumps({"conversation_id": cid, "human": human}))
            verdict = {"1": "pass", "2": "fail", None: "unscored"}[w_orig]
            vf.write(orjson.dumps({"conversation_id": cid, "verdict": verdict, "judge_version": "llmbar"}))
            choice = {"1": "a", "2": "b", None: None}
            pf.write(orjson.dumps({"first_choice": choice[w_orig], "second_choice": choice[w_swap]}))
            for f in (lf, vf, pf):
                f.write(b"\n")
    return labels, verdicts, pairwise


def _wilson(k: int, n: int) -> tuple[float, float]:
    z = 1.959963984540054
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize("subset", SUBSETS)
@pytest.mark.parametrize("evaluator", EVALUATORS)
def test_llmbar_agreement_matches_independent_count(tmp_path: Path, subset: str, evaluator: str) -> None:
    rows, stats = _results(subset, evaluator)
    labels, verdicts, pairwise = _write_sets(tmp_path, rows)
    pairs, missing = pairs_from_verdicts(load_labels(labels), load_verdicts(verdicts), "x")
    assert missing == []
    out = report("llmbar", str(labels), pairs, Thresholds(min_labels=50, min_kappa=0.6))
    (v,) = out["versions"]
    ag = v["agreement"]

    # independent count straight from the published file
    tp = fn = fp = tn = unscored = 0
    for row in rows:
        gold_fail = int(row["label"]) == 2
        w = row["results"][0]["swap = False"]["winner"]
        if w is None:
            unscored += 1
            continue
        judge_fail = w == "2"
        tp += gold_fail and judge_fail
        fn += gold_fail and not judge_fail
        fp += (not gold_fail) and judge_fail
        tn += (not gold_fail) and not judge_fail
    n = tp + fn + fp + tn
    assert v["unscored"] == unscored
    assert ag["confusion"] == {"tp": tp, "fn": fn, "fp": fp, "tn": tn}
    assert ag["n"] == n == len(rows) - unscored

    # percent agreement equals LLMBar's own published accuracy ("correct_False": "95 / 100 = 95.0%")
    correct, total = (int(x) for x in stats["correct_False"].split("=")[0].split("/"))
    assert ag["percent_agreement"]["count"] == tp + tn == correct
    assert total == len(rows)
    assert ag["percent_agreement"]["value"] == pytest.approx((tp + tn) / n)

    # Cohen's kappa by hand from the confusion matrix
    po = (tp + tn) / n
    pe = ((tp + fn) * (tp + fp) + (fp + tn) * (fn + tn)) / n**2
    assert ag["kappa"]["value"] == pytest.approx((po - pe) / (1 - pe), abs=1e-12)
    assert ag["kappa"]["low"] < ag["kappa"]["value"] < ag["kappa"]["high"]

    assert ag["tpr"]["value"] == pytest.approx(tp / (tp + fn))
    assert ag["tnr"]["value"] == pytest.approx(tn / (tn + fp))
    assert ag["precision"]["value"] == pytest.approx(tp / (tp + fp))
    low, high = _wilson(tp, tp + fn)
    assert (ag["tpr"]["low"], ag["tpr"]["high"]) == pytest.approx((low, high), abs=1e-9)

    expected_state = "calibrated" if n >= 50 and (po - pe) / (1 - pe) >= 0.6 else "uncalibrated"
    assert v["state"] == expected_state


@pytest.mark.parametrize("evaluator", EVALUATORS)
def test_llmbar_position_bias(tmp_path: Path, evaluator: str) -> None:
    rows, stats = _results("Natural", evaluator)
    _, _, pairwise = _write_sets(tmp_path, rows)
    first, second = load_pairwise(pairwise)
    bias = position_bias(first, second)
    results = [r["results"][0] for r in rows]
    both = [(r["swap = False"]["winner"], r["swap = True"]["winner"]) for r in results]
    scored = [(a, b) for a, b in both if a is not None and b is not None]
    flips = sum(1 for a, b in scored if a != b)
    assert bias["comparisons"] == len(scored)
    assert bias["flips"] == flips
    assert bias["rate"]["value"] == pytest.approx(flips / len(scored))
    # LLMBar publishes "equal": how often both orders agree
    equal = int(stats["equal"].split("/")[0])
    assert len(scored) - flips == equal - sum(1 for a, b in both if a is None and b is None)
    assert bias["favoured_position"].get("first", 0) == sum(1 for a, b in scored if (a, b) == ("1", "2"))


def test_llmbar_gpt4_beats_chatgpt(tmp_path: Path) -> None:
    """The published finding: GPT-4 agrees with gold far more than ChatGPT on the adversarial set."""
    kappas = {}
    for ev in ("GPT-4/Vanilla", "ChatGPT/Vanilla"):
        rows, _ = _results("Adversarial/Neighbor", ev)
        d = tmp_path / ev.replace("/", "_")
        d.mkdir()
        labels, verdicts, _ = _write_sets(d, rows)
        pairs, _ = pairs_from_verdicts(load_labels(labels), load_verdicts(verdicts), "x")
        kappas[ev] = report("j", "f", pairs, Thresholds(50, 0.6))["versions"][0]["agreement"]["kappa"]
    assert kappas["GPT-4/Vanilla"]["low"] > kappas["ChatGPT/Vanilla"]["high"]


@pytest.mark.parametrize("evaluator", EVALUATORS[:2])
def test_llmbar_three_way_agreement_with_ties(tmp_path: Path, evaluator: str) -> None:
    """Human A/B on LLMBar against the judge's choice: in the first order, and from both orders (a choice
    the two orders disagree on is a tie). Kappa checked against the formula on the same counts."""
    from vigil.calibration.labelsets import load_pairwise_human
    from vigil.calibration.stats import both_orders, three_way_agreement

    rows, _ = _results("Natural", evaluator)
    path = tmp_path / "pairwise.jsonl"
    pick = {"1": "a", "2": "b", None: None}
    with path.open("wb") as f:
        for r in rows:
            res = r["results"][0]
            f.write(
                orjson.dumps(
                    {
                        "first_choice": pick[res["swap = False"]["winner"]],
                        "second_choice": pick[res["swap = True"]["winner"]],
                        "human": pick[str(r["label"])],
                    }
                )
                + b"\n"
            )
    first, second = load_pairwise(path)
    human = load_pairwise_human(path)
    for judge in (first, both_orders(first, second)):
        tw = three_way_agreement(human, judge)
        pairs = [(h, j) for h, j in zip(human, judge, strict=True) if h and j]
        assert tw["n"] == len(pairs) and tw["ties"]["human"] == 0
        agree = sum(1 for h, j in pairs if h == j)
        assert tw["percent_agreement"]["value"] == pytest.approx(agree / len(pairs))
        cats = ("a", "b", "tie")
        n = len(pairs)
        pe = sum((sum(1 for h, _ in pairs if h == c) / n) * (sum(1 for _, j in pairs if j == c) / n) for c in cats)
        assert tw["kappa"]["value"] == pytest.approx((agree / n - pe) / (1 - pe))
    consistent = three_way_agreement(human, both_orders(first, second))
    flips = sum(1 for a, b in zip(first, second, strict=True) if a and b and a != b)
    assert consistent["ties"]["judge"] == flips  # every order flip became a tie


def test_three_way_with_human_ties() -> None:
    from vigil.calibration.stats import three_way_agreement

    tw = three_way_agreement(["a", "tie", "b", "tie", None], ["a", "tie", "a", "b", "a"])
    assert tw["n"] == 4 and tw["left_out"] == 1
    assert tw["confusion"]["tie"]["tie"] == 1 and tw["confusion"]["b"]["tie"] == 1 and tw["confusion"]["a"]["b"] == 1
    assert tw["percent_agreement"]["value"] == pytest.approx(0.5)
