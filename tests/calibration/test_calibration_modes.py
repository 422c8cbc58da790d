"""The offline judge and the model share a judge's name and version: neither's figures count for the other."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from tests.support.app import REVIEWER, make_settings
from tests.support.judge_fakes import judge_dir
from tests.support.review import simulated
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.calibration.calibrate import calibrate, judge_one
from vigil.calibration.labelsets import LabelledItem, LabelledSet
from vigil.calibration.overview import Calibration, save_run
from vigil.judge.stage import JudgeStage
from vigil.runtime import Runtime
from vigil.schema import Conversation
from vigil.store.models import ReviewLabelRow, VerdictRow


def _runtime(tmp: Path, mode: str) -> Runtime:
    settings = make_settings(
        f"sqlite:///{tmp / 'v.db'}",
        judges_dir=str(judge_dir(tmp / "judges")),
        judge_mode=mode,
        calibration_min_labels=10,
        calibration_correction_labels="all",
    )
    return wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})


def _verdict(c: Conversation, verdict: str, offline: bool) -> VerdictRow:
    return VerdictRow(
        judge="tj",
        judge_version="3",
        conversation_id=c.conversation_id,
        revision=1,
        agent_id=c.agent_id,
        agent_version=c.agent_version,
        verdict=verdict,
        categories=[],
        model="offline-judge" if offline else "m",
        offline=offline,
        prompt_hash="h",
        reason="sampled",
    )


def test_offline_figures_never_calibrate_the_model(tmp_path: Path) -> None:
    offline = _runtime(tmp_path, "offline")
    convs = [Conversation.model_validate(c) for c in simulated(40, "v1:0.5", seed=11)]
    offline.pipeline.process(convs, "test")
    engine = offline.get(JudgeStage).engine
    verdicts = {c.conversation_id: asyncio.run(judge_one(engine, offline.rules, "tj", c)).verdict for c in convs}
    scored = [c for c in convs if verdicts[c.conversation_id] in ("pass", "fail")]
    assert {verdicts[c.conversation_id] for c in scored} == {"pass", "fail"}
    # people agree with the offline judge everywhere: a labelled set, review labels and sampled verdicts
    labels = LabelledSet(
        "agreeing.jsonl",
        [LabelledItem(c.conversation_id, verdicts[c.conversation_id] == "fail", None, c) for c in scored],
    )
    result = asyncio.run(calibrate(offline, "tj", labels))
    assert result["mode"] == "offline" and result["versions"][0]["state"] == "calibrated"
    with offline.sessions.begin() as s:
        save_run(s, "tj", "agreeing.jsonl", result["mode"], result)
        for c in scored:
            fail = verdicts[c.conversation_id] == "fail"
            s.add(_verdict(c, verdicts[c.conversation_id], offline=True))
            s.add(
                ReviewLabelRow(
                    conversation_id=c.conversation_id,
                    revision=1,
                    reviewer="rita",
                    label="confirmed_failure" if fail else "not_a_failure",
                    category="wrong_action" if fail else None,
                    version=1,
                    is_current=True,
                )
            )
    with offline.sessions() as s:
        full = offline.get(Calibration).judge(s, "tj")
    assert full["state"] == "calibrated"
    (v,) = full["versions"]
    assert v["review_queue"]["agreement"]["n"] == len(scored) and v["labelled_set"]["mode"] == "offline"
    assert v["rates"] and v["rates"][0]["raw"]["n"] == len(scored)
    offline_mode = full.get("mode")
    offline.close()

    # the same database served with a provider key: the model has no measurement of its own yet
    live = _runtime(tmp_path, "live")
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app

    with TestClient(build_app(live)) as client:
        listing = client.get("/v1/judges", headers=REVIEWER).json()
        tj = next(j for j in listing if j["name"] == "tj")
        assert tj["calibration"]["state"] == "uncalibrated", tj["calibration"]
        assert tj["calibration"]["labels"] == 0
        full = client.get("/v1/judges/tj/calibration", headers=REVIEWER).json()
        assert full["state"] == "uncalibrated"
        (v,) = full["versions"]
        assert v["review_queue"] is None and v["labelled_set"] is None and v["rates"] == []
        live_mode = full.get("mode")
        # the model's own verdicts on the same conversations do count
        with live.sessions.begin() as s:
            for c in scored:
                s.add(_verdict(c, "fail", offline=False))
        v = client.get("/v1/judges/tj/calibration", headers=REVIEWER).json()["versions"][0]
        assert v["review_queue"]["agreement"]["n"] == len(scored)
        assert v["rates"][0]["raw"]["n"] == len(scored) and v["rates"][0]["raw"]["value"] == 1.0
    live.close()
    assert (offline_mode, live_mode) == ("offline", "live")
