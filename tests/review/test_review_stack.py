"""The review stage wired with every other stage: outcomes and judge verdicts flag conversations."""

from __future__ import annotations

import asyncio
import re
from urllib.parse import quote

from prometheus_client import CollectorRegistry

from tests.support.app import INGEST, REVIEWER, make_client, make_settings
from tests.support.review import simulated
from vigil.app.runtime import build_runtime
from vigil.app.wiring import STAGES
from vigil.judge.stage import JudgeStage


def test_outcomes_and_offline_judge_verdicts_reach_the_queue_and_the_page(sqlite_url) -> None:
    assert "review" in [stage.name for stage in STAGES]
    rt = build_runtime(make_settings(sqlite_url, judge_poll_interval_seconds=0.05), registry=CollectorRegistry())
    with make_client(rt, {"api"}) as api:
        convs = simulated(24, "v1:0.5", seed=12)
        assert api.post("/v1/conversations", json=convs, headers=INGEST).status_code == 202
        queued = {it["conversation_id"] for it in api.get("/v1/review/queue", headers=REVIEWER).json()["items"]}
        quiet = next(c for c in convs if c["conversation_id"] not in queued)
        cid = quiet["conversation_id"]
        r = api.post(
            "/v1/outcomes",
            json=[{"conversation_id": cid, "type": "escalation", "idempotency_key": f"{cid}:esc"}],
            headers=INGEST,
        )
        assert r.status_code < 300, r.text
        item = api.get(f"/v1/review/items/{cid}", headers=REVIEWER).json()
        assert [(x["kind"], x["key"]) for x in item["reasons"]] == [("outcome", "escalation")]

        # the judge stage (offline: no provider key) judges what its sampler queued; fails flag for review
        from vigil.judge.worker import JudgeWorker

        stage = rt.get(JudgeStage)
        asyncio.run(JudgeWorker(stage.engine, rt.hooks.verdict_listeners).run_until_idle(timeout=120))
        verdicts = {
            v["conversation_id"]: v
            for c in convs
            for v in api.get(f"/v1/conversations/{c['conversation_id']}", headers=REVIEWER).json()["verdicts"]
        }
        assert verdicts, "the judge produced no verdict"
        failed = [v for v in verdicts.values() if v["verdict"] == "fail"]
        assert failed
        for v in failed:
            reasons = api.get(f"/v1/review/items/{v['conversation_id']}", headers=REVIEWER).json()["reasons"]
            # offline verdicts flag under their own key, so the queue never passes them off as the model's
            assert v["offline"] and ("judge_fail", v["judge"] + ":offline") in {(x["kind"], x["key"]) for x in reasons}

        # the conversation page shows the verdict, its rationale and the offline badge
        some = next(iter(verdicts.values()))
        page = api.get("/ui/login")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        api.post("/ui/login", data={"csrf": token, "api_key": "rita-key"})
        queue = api.get("/ui/queue").text
        assert f"judge fail: {failed[0]['judge']}:offline</span>" in queue
        html = api.get(f"/ui/review/{quote(some['conversation_id'], safe='')}").text
        assert f"verdict-{some['verdict']}" in html and "offline judge" in html
        if some["rationale"]:
            assert some["rationale"][:40].replace("'", "&#39;").replace('"', "&#34;") in html
    rt.close()
