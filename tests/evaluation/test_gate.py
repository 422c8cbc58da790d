"""``vigil gate`` on real τ² results files, Vigil's native JSONL and a real Inspect log.

The "worse candidate" is built from the real 1-trial telecom run: the same file with the rewards of its
first eight successful tasks set to 0 (everything else, messages, costs and durations, untouched). The
4-trial and 1-trial telecom runs share no task, so they are compared unpaired, and their graders differ
(ENV_ASSERTION alone vs ACTION+ENV_ASSERTION): the gate must say so instead of calling it a regression.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from tests.support.cli import cli_runner
from tests.support.services import shared_data
from vigil.app.cli import app

TELECOM_1 = ("tau2", "trajectories", "sierra_gpt-4.1_telecom_default_gpt-4.1_1trials.json")
TELECOM_4 = (
    "tau2",
    "trajectories",
    "sierra_testrun1_gpt-4.1-2025-04-14_telecom_no-user_gpt-4.1-2025-04-14_4trials_5tasks.json",
)


def _gate(baseline: Path, candidate: Path, *extra: str):  # type: ignore[no-untyped-def]
    return cli_runner().invoke(app, ["gate", "--baseline", str(baseline), "--candidate", str(candidate), *extra])


def _rows(result) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {r["signal"]: r for r in orjson.loads(result.stdout)["rows"]}


def _flip_successes(src: Path, dst: Path, count: int) -> list[str]:
    data = json.loads(src.read_text())
    flipped = []
    for sim in data["simulations"]:
        if len(flipped) < count and sim["reward_info"]["reward"] == 1.0:
            sim["reward_info"]["reward"] = 0.0
            flipped.append(sim["task_id"])
    dst.write_text(json.dumps(data))
    return flipped


def test_worse_candidate_fails_the_gate(tmp_path: Path) -> None:
    base = shared_data(*TELECOM_1)
    worse = tmp_path / "worse.json"
    assert len(_flip_successes(base, worse, 8)) == 8
    result = _gate(base, worse)
    assert result.exit_code == 1, result.output
    for signal in (
        "pass@1 (= pass^1)",
        "avg steps",
        "cost per task (USD)",
        "p95 latency (s)",
        "forbidden-tool rate",
        "error rate",
        "truncation rate",
    ):
        assert signal in result.stdout
    assert "REGRESSION: pass@1" in result.stdout
    rows = _rows(_gate(base, worse, "--json"))
    pass1 = rows["pass@1 (= pass^1)"]
    assert pass1["paired"] and pass1["verdict"] == "REGRESSION"
    assert pass1["baseline"]["value"] == pytest.approx(18 / 40) and pass1["candidate"]["value"] == pytest.approx(
        10 / 40
    )
    assert pass1["difference"]["value"] == pytest.approx(-0.2) and pass1["difference"]["high"] < 0
    assert rows["avg steps"]["verdict"] == "no significant change"


def test_same_run_passes_the_gate() -> None:
    base = shared_data(*TELECOM_1)
    result = _gate(base, base, "--json")
    assert result.exit_code == 0, result.output
    out = orjson.loads(result.stdout)
    assert out["comparable"] and not out["regression"] and out["tasks"]["shared"] == 40
    assert all(r["verdict"] in ("no significant change", "no interval") for r in out["rows"])


def test_fewer_successes_that_is_noise_passes(tmp_path: Path) -> None:
    base = shared_data(*TELECOM_1)
    slightly = tmp_path / "slightly.json"
    _flip_successes(base, slightly, 2)  # 18 → 16 of 40: within the paired interval
    result = _gate(base, slightly)
    assert result.exit_code == 0, result.output


def test_every_shared_task_moving_alike_is_a_permutation_test_not_proof(tmp_path: Path) -> None:
    # every task's difference is -1: no spread, so no t test; two tasks are two coin flips (p = 2/2^2),
    # eight are not (p = 2/2^8)
    for tasks, exit_code, verdict in ((2, 0, "worse (not after Holm)"), (8, 1, "REGRESSION")):
        base = _native(tmp_path / f"base{tasks}.jsonl", [{"task_id": f"t{i}", "success": True} for i in range(tasks)])
        cand = _native(tmp_path / f"cand{tasks}.jsonl", [{"task_id": f"t{i}", "success": False} for i in range(tasks)])
        result = _gate(base, cand, "--json")
        assert result.exit_code == exit_code, result.output
        pass1 = _rows(result)["pass@1 (= pass^1)"]
        assert pass1["paired"] and pass1["difference"]["value"] == -1.0
        assert pass1["difference"]["p_value"] == pytest.approx(2 / 2**tasks)
        assert pass1["verdict"] == verdict


def test_runs_without_shared_tasks_and_a_changed_grader(tmp_path: Path) -> None:
    result = _gate(shared_data(*TELECOM_1), shared_data(*TELECOM_4), "--json")
    assert result.exit_code == 0, result.output
    out = orjson.loads(result.stdout)
    assert out["tasks"]["shared"] == 0 and not out["comparable"]
    differs = {p["key"] for p in out["protocol"] if not p["same"]}
    assert {"model", "harness", "user", "grader"} <= differs
    assert "grader" in out["graders_changed"]
    rows = {r["signal"]: r for r in out["rows"]}
    assert rows["pass@1 (= pass^1)"]["verdict"] == "grader changed (grader)"
    assert not rows["pass@1 (= pass^1)"]["paired"]
    text = _gate(shared_data(*TELECOM_1), shared_data(*TELECOM_4))
    assert "DIFFERS" in text.stdout and "unpaired" in text.stdout


def test_multi_rollout_run_reports_pass_hat_k_at_powers_of_two(tmp_path: Path) -> None:
    four = shared_data(*TELECOM_4)
    data = json.loads(four.read_text())
    target = sorted({s["task_id"] for s in data["simulations"]})[1]
    for sim in data["simulations"]:  # one task that always passed now passes one trial in four
        if sim["task_id"] == target and sim["trial"] != 0:
            assert sim["reward_info"]["reward"] == 1.0
            sim["reward_info"]["reward"] = 0.0
    cand = tmp_path / "cand.json"
    cand.write_text(json.dumps(data))
    result = _gate(four, cand, "--json")
    rows = _rows(result)
    assert {"pass@1 (= pass^1)", "pass^2", "pass@2", "pass^4", "pass@4"} <= set(rows)
    assert rows["pass^4"]["baseline"]["value"] == pytest.approx(4 / 5)
    assert rows["pass^4"]["candidate"]["value"] == pytest.approx(3 / 5)
    assert rows["pass@4"]["difference"]["value"] == pytest.approx(0.0)
    assert rows["pass^4"]["difference"]["tasks"] == 5  # tasks, not rollouts, are the sample
    assert rows["tasks all rollouts pass"]["candidate"]["value"] == pytest.approx(3 / 5)
    assert result.exit_code == 0  # one task in five is not evidence


def _native(path: Path, rows: list[dict], protocol: dict | None = None) -> Path:
    header = {
        "format": "vigil.results",
        "version": 1,
        "protocol": protocol or {"model": "m1", "grader": "exact-match v1"},
    }
    path.write_text("\n".join(json.dumps(x) for x in [header, *rows]) + "\n")
    return path


def test_a_run_with_no_scored_rollout_is_bad_input_not_a_regression(tmp_path: Path) -> None:
    base = _native(tmp_path / "base.jsonl", [{"task_id": f"t{i}", "success": True} for i in range(5)])
    unscored = _native(tmp_path / "unscored.jsonl", [{"task_id": f"t{i}", "success": None} for i in range(5)])
    for args in ((base, unscored), (unscored, base)):
        result = _gate(*args)
        assert result.exit_code == 2, result.output
        assert "none of its 5 rollouts has a success score" in result.output
        assert "Traceback" not in result.output


def test_native_results_red_flag_when_cheaper_but_worse(tmp_path: Path) -> None:
    base_rows = [{"task_id": f"t{i}", "success": i % 5 != 0, "steps": 10, "cost_usd": 0.10} for i in range(60)]
    cand_rows = [
        {"task_id": f"t{i}", "success": i % 5 != 0 and i % 3 != 0, "steps": 6, "cost_usd": 0.05} for i in range(60)
    ]
    base = _native(tmp_path / "base.jsonl", base_rows)
    cand = _native(tmp_path / "cand.jsonl", cand_rows)
    result = _gate(base, cand, "--json")
    assert result.exit_code == 1, result.output
    out = orjson.loads(result.stdout)
    assert any(f.startswith("pass@1 (= pass^1): worse while avg steps and cost per task") for f in out["red_flags"])
    assert {r["signal"]: r for r in out["rows"]}["avg steps"]["verdict"] == "improved"
    # the same scores under another grader are not a regression: they were not produced the same way
    regraded = _native(tmp_path / "regraded.jsonl", cand_rows, {"model": "m1", "grader": "llm-judge v2"})
    result = _gate(base, regraded, "--json")
    assert result.exit_code == 0, result.output
    assert _rows(result)["pass@1 (= pass^1)"]["verdict"] == "grader changed (grader)"


def test_bad_input_exits_2(tmp_path: Path) -> None:
    good = shared_data(*TELECOM_1)
    assert _gate(tmp_path / "absent.json", good).exit_code == 2
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    r = _gate(good, junk)
    assert r.exit_code == 2 and "not a results file the gate reads" in r.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "vigil.results", "version": 1}\n{"task_id": "t1", "success": "maybe"}\n')
    r = _gate(good, bad)
    assert r.exit_code == 2 and "bad.jsonl:2" in r.output
    future = tmp_path / "future.jsonl"
    future.write_text('{"format": "vigil.results", "version": 9}\n')
    r = _gate(good, future)
    assert r.exit_code == 2 and "v1 header" in r.output


@pytest.mark.slow
def test_inspect_logs_from_a_real_eval(tmp_path: Path) -> None:
    """Two real Inspect runs (the mock model answers 'yes'; the candidate answers 'no' to half the tasks)."""
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    def reply(text: str) -> ModelOutput:
        out = ModelOutput.from_content("mockllm/model", text)
        out.usage = ModelUsage(input_tokens=10, output_tokens=2, total_tokens=12)  # no tokenizer download
        return out

    samples = [Sample(input=f"question {i}", target="yes", id=f"t{i}") for i in range(24)]
    logs = []
    for answers in (["yes"] * 24, ["yes" if i % 2 else "no" for i in range(24)]):
        model = get_model("mockllm/model", custom_outputs=[reply(a) for a in answers])
        task = Task(dataset=samples, solver=generate(), scorer=match(), name="suite")
        [log] = inspect_eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none", max_samples=1)
        assert log.status == "success"
        logs.append(Path(log.location))
    result = _gate(logs[0], logs[1], "--json")
    assert result.exit_code == 1, result.output
    out = orjson.loads(result.stdout)
    assert out["baseline"]["format"] == "inspect" and out["tasks"]["shared"] == 24
    pass1 = {r["signal"]: r for r in out["rows"]}["pass@1 (= pass^1)"]
    assert pass1["baseline"]["value"] == 1.0 and pass1["candidate"]["value"] == 0.5 and pass1["verdict"] == "REGRESSION"
    assert {p["key"] for p in out["protocol"]} >= {"model", "harness", "grader"}
    assert _gate(logs[0], logs[0]).exit_code == 0


def test_protocol_from_the_conversations_metadata_where_the_header_says_nothing(tmp_path: Path) -> None:
    def rows(model: str, grader: str) -> list[dict]:
        meta = {"model": model, "temperature": 0.2, "harness": "runner 3", "grader": grader, "tools": ["lookup"]}
        conv = {
            "conversation_id": "c",
            "agent_id": "a",
            "agent_version": "v",
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
            "metadata": meta,
        }
        return [{"task_id": f"t{i}", "success": i % 4 != 0, "conversation": conv} for i in range(40)]

    base = _native(tmp_path / "base.jsonl", rows("m1", "exact v1"), {"judge": None})
    cand = _native(tmp_path / "cand.jsonl", rows("m2", "rubric v2"), {"judge": None})
    out = orjson.loads(_gate(base, cand, "--json").stdout)
    proto = {p["key"]: p for p in out["protocol"]}
    assert (proto["model"]["baseline"], proto["model"]["candidate"], proto["model"]["same"]) == ("m1", "m2", False)
    assert proto["sampling"]["same"] and proto["harness"]["baseline"] == "runner 3" and proto["tools"]["same"]
    assert out["graders_changed"] == ["grader"]
    assert {r["signal"]: r for r in out["rows"]}["pass@1 (= pass^1)"]["verdict"] == "grader changed (grader)"
    # what the header says wins over the metadata
    named = _native(tmp_path / "named.jsonl", rows("m2", "rubric v2"), {"model": "m1", "grader": "exact v1"})
    out = orjson.loads(_gate(base, named, "--json").stdout)
    assert {p["key"]: p["same"] for p in out["protocol"]}["model"] and not out["graders_changed"]


def test_rows_that_cannot_differ_stay_out_of_the_gates_holm_family() -> None:
    """A gating row where every task scored the same on both sides (no spread, no difference) has p = 1
    under any relabelling; leaving it out of Holm's family keeps a real regression a regression."""
    from vigil.compare.paired import Interval
    from vigil.evaluation.gate import Row, judge_rows

    def row(signal: str, value: float, se: float, p: float) -> Row:
        side = Interval(0.5, 0.05, 0.4, 0.6, 40)
        low, high = value - 2 * se, value + 2 * se
        return Row(signal, "rate", "higher", None, side, side, Interval(value, se, low, high, 40, p), True)

    real = row("task success", -0.1, 0.04, 0.012)
    flat = [row(f"flat {i}", 0.0, 0.0, 1.0) for i in range(4)]
    judge_rows([real, *flat], set())
    assert real.verdict == "REGRESSION"  # 0.012 over 1 row, not over 5 (0.06)
    real = row("task success", -0.1, 0.04, 0.012)
    judge_rows([real, *(row(f"moved {i}", 0.01, 0.05, 0.8) for i in range(4))], set())
    assert real.verdict == "worse (not after Holm)"  # rows that could differ still count
