"""``vigil calibrate``: recorded LLMBar verdicts through the CLI, and a judge run over a labelled set of
real τ² conversations (human verdict: the benchmark's reward), offline and live with a scripted model."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import REVIEWER, make_client, make_settings
from tests.support.cli import cli_runner
from tests.support.judge_fakes import FAIL, PASS, Scripted, judge_dir
from tests.support.services import shared_data
from vigil.app.cli import app
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.calibration.calibrate import calibrate
from vigil.calibration.errors import CalibrationError
from vigil.calibration.labelsets import load_labels, load_verdicts
from vigil.ingest.importers import load_file
from vigil.judge.client import ClientOverride
from vigil.settings import PROJECT_ROOT

AIRLINE = ("tau2", "trajectories", "sierra_gpt-4.1_airline_default_gpt-4.1_1trials.json")


def _llmbar_files(tmp: Path) -> tuple[Path, Path, Path, list[dict]]:
    base = shared_data("judge_human", "llmbar", "LLMBar", "Natural", "evaluators", "GPT-4", "Vanilla")
    rows = json.loads((base / "result.json").read_text())
    labels, verdicts, pairwise = tmp / "labels.jsonl", tmp / "verdicts.jsonl", tmp / "pairwise.jsonl"
    choice = {"1": "a", "2": "b", None: None}
    with labels.open("wb") as lf, verdicts.open("wb") as vf, pairwise.open("wb") as pf:
        for i, r in enumerate(rows):
            w, ws = r["results"][0]["swap = False"]["winner"], r["results"][0]["swap = True"]["winner"]
            lf.write(orjson.dumps({"conversation_id": f"n{i}", "human": "fail" if r["label"] == 2 else "pass"}) + b"\n")
            vf.write(orjson.dumps({"conversation_id": f"n{i}", "verdict": {"1": "pass", "2": "fail"}[w]}) + b"\n")
            pf.write(orjson.dumps({"first_choice": choice[w], "second_choice": choice[ws]}) + b"\n")
    return labels, verdicts, pairwise, rows


def test_cli_calibrate_recorded_llmbar_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    labels, verdicts, pairwise, rows = _llmbar_files(tmp_path)
    db = tmp_path / "v.db"
    monkeypatch.setenv("VIGIL_DATABASE_URL", f"sqlite:///{db}")
    monkeypatch.setenv("VIGIL_CALIBRATION_MIN_LABELS", "50")
    monkeypatch.setenv("VIGIL_JUDGES_DIR", str(tmp_path / "no-judges"))  # measuring needs no definition
    args = [
        "calibrate",
        "gpt4-llmbar",
        "--labels",
        str(labels),
        "--verdicts",
        str(verdicts),
        "--pairwise",
        str(pairwise),
    ]
    r = cli_runner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output  # calibrated: exit 0
    out = json.loads(r.stdout)
    (v,) = out["versions"]
    correct = sum(1 for row in rows if str(row["label"]) == row["results"][0]["swap = False"]["winner"])
    assert v["agreement"]["percent_agreement"]["count"] == correct == 95  # LLMBar's published 95 / 100
    assert v["state"] == "calibrated" and v["judge_version"] == "unknown"
    assert out["position_bias"]["flips"] == 5 and out["mode"] == "verdicts"
    # the run is stored: the API shows this judge as calibrated from its labelled set
    rt = build_runtime(make_settings(f"sqlite:///{db}", judges_dir=str(tmp_path)), registry=CollectorRegistry())
    with make_client(rt) as client:
        got = client.get("/v1/judges/gpt4-llmbar/calibration", headers=REVIEWER).json()
        assert got["state"] == "calibrated" and got["versions"][0]["labelled_set"]["source"] == str(labels)
    rt.close()
    # human-readable report; a stricter threshold makes it uncalibrated and exits 1
    monkeypatch.setenv("VIGIL_CALIBRATION_MIN_KAPPA", "0.95")
    r = cli_runner().invoke(app, [*args, "--no-save"])
    assert r.exit_code == 1 and "uncalibrated" in r.stdout and "Cohen's kappa" in r.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversation_id": "x", "human": "pass"}\nnot json\n')
    r = cli_runner().invoke(app, ["calibrate", "gpt4-llmbar", "--labels", str(bad), "--verdicts", str(verdicts)])
    assert r.exit_code == 2 and "bad.jsonl:2: not valid JSON" in r.output


def _airline_set(tmp: Path, n: int = 24) -> tuple[Path, list]:
    convs = list(load_file(shared_data(*AIRLINE), "auto", None, None))[:n]
    path = tmp / "airline.jsonl"
    with path.open("wb") as fh:
        for c in convs:
            reward = next(o.value for o in c.outcomes if o.type == "task_success")
            human = "pass" if reward >= 1 else "fail"
            fh.write(
                orjson.dumps({"conversation": c.model_dump(mode="json", exclude_none=True), "human": human}) + b"\n"
            )
    return path, convs


def _runtime(tmp: Path, **overrides: object):  # type: ignore[no-untyped-def]
    settings = make_settings(
        f"sqlite:///{tmp / 'v.db'}",
        rule_packs=str(PROJECT_ROOT / "rules" / "*.yaml"),
        calibration_min_labels=10,
        **overrides,
    )
    return build_runtime(settings, registry=CollectorRegistry())


def test_calibrate_runs_the_live_judge_through_the_judge_engine(tmp_path: Path) -> None:
    path, convs = _airline_set(tmp_path)
    folder = judge_dir(tmp_path / "judges", transcript={"max_chars": 2_000_000, "max_chars_per_message": 200_000})
    rt = _runtime(tmp_path, judges_dir=str(folder), judge_mode="live")
    transfer = re.compile(r"tool call \S* transfer_to_human_agents\]")

    def reply(messages: list[dict[str, str]]) -> str:
        return FAIL if transfer.search(messages[-1]["content"]) else PASS

    scripted = Scripted(default=reply)
    rt.provide(ClientOverride(scripted))
    wire(rt, {"api"})
    result = asyncio.run(calibrate(rt, "tj", load_labels(path)))
    assert result["mode"] == "live" and len(scripted.calls) == len(convs)
    (v,) = result["versions"]
    assert v["judge_version"] == "3"
    expected = Counter()
    for c in convs:
        human = next(o.value for o in c.outcomes if o.type == "task_success") < 1
        judge = any(t.name == "transfer_to_human_agents" for m in c.messages for t in m.tool_calls or [])
        expected[(human, judge)] += 1
    c = v["agreement"]["confusion"]
    assert (c["tp"], c["fn"], c["fp"], c["tn"]) == (
        expected[(True, True)],
        expected[(True, False)],
        expected[(False, True)],
        expected[(False, False)],
    )
    rt.close()


def test_calibrate_offline_judge_from_the_judges_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --labels, the sets in judges/<name>/calibration/ are used; the offline judge needs no key."""
    judges = judge_dir(tmp_path / "judges")
    (judges / "tj" / "calibration").mkdir()
    path, convs = _airline_set(judges / "tj" / "calibration", n=12)
    monkeypatch.setenv("VIGIL_DATABASE_URL", f"sqlite:///{tmp_path / 'v.db'}")
    monkeypatch.setenv("VIGIL_JUDGES_DIR", str(judges))
    monkeypatch.setenv("VIGIL_JUDGE_MODE", "offline")
    monkeypatch.setenv("VIGIL_RULE_PACKS", str(PROJECT_ROOT / "rules" / "*.yaml"))
    r = cli_runner().invoke(app, ["calibrate", "tj", "--json"])
    assert r.exit_code in (0, 1), r.output
    out = json.loads(r.stdout)
    assert out["mode"] == "offline" and out["source"] == str(path)
    (v,) = out["versions"]
    assert v["agreement"]["n"] + v["unscored"] == len(convs) and v["state"] == "uncalibrated"
    r = cli_runner().invoke(app, ["calibrate", "nope", "--labels", str(path)])
    assert r.exit_code == 2 and "no judge 'nope'" in r.output


def test_cli_calibrate_that_measured_nothing_is_not_a_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A label whose conversation had no recorded verdict: nothing was measured, and the command exited 0,
    which a CI gate reads as 'every version calibrated'."""
    labels, verdicts = tmp_path / "labels.jsonl", tmp_path / "verdicts.jsonl"
    labels.write_text('{"conversation_id": "c1", "human": "fail"}\n')
    verdicts.write_text('{"conversation_id": "other", "verdict": "fail"}\n')
    monkeypatch.setenv("VIGIL_DATABASE_URL", f"sqlite:///{tmp_path / 'v.db'}")
    monkeypatch.setenv("VIGIL_JUDGES_DIR", str(tmp_path / "no-judges"))
    args = ["calibrate", "j", "--labels", str(labels), "--verdicts", str(verdicts), "--no-save"]
    r = cli_runner().invoke(app, [*args, "--json"])
    assert r.exit_code == 1, r.output
    assert json.loads(r.stdout)["versions"] == []
    assert "no judge version was measured" in r.output


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"human": "pass"}, "needs a conversation or a conversation_id"),
        ({"conversation_id": "", "human": "pass"}, "needs a conversation or a conversation_id"),
        ({"conversation_id": 17, "human": "pass"}, "conversation_id must be a string, not 17"),
        ({"conversation_id": ["c-1"], "human": "fail"}, "conversation_id must be a string, not ['c-1']"),
    ],
)
def test_a_labelled_line_says_what_is_wrong_with_its_conversation_id(tmp_path: Path, line: dict, message: str) -> None:
    path = tmp_path / "labels.jsonl"
    path.write_bytes(b'{"conversation_id": "c-0", "human": "fail"}\n' + orjson.dumps(line) + b"\n")
    with pytest.raises(CalibrationError) as err:
        load_labels(path)
    assert str(err.value) == f"{path}:2: {message}"


def test_a_verdicts_line_says_what_is_wrong_with_its_conversation_id(tmp_path: Path) -> None:
    path = tmp_path / "verdicts.jsonl"
    path.write_bytes(b'{"conversation_id": 42, "verdict": "pass"}\n')
    with pytest.raises(CalibrationError) as err:
        load_verdicts(path)
    assert str(err.value) == f"{path}:1: conversation_id must be a string, not 42"
