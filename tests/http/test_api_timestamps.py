"""Timestamps in API answers name their zone (UTC) on SQLite, whose driver hands back naive datetimes, and Postgres."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry

from tests.support.app import ADMIN, INGEST, REVIEWER, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.detector.models import DetectionRow


def utc(text: str) -> datetime:
    """Parses an ISO timestamp and insists it carries a UTC offset."""
    assert text.endswith(("Z", "+00:00")), text
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert parsed.utcoffset() == timedelta(0), text
    return parsed


def test_alerts_and_dead_letters_carry_utc(db_url) -> None:
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    with rt.sessions.begin() as s:
        for ended in (None, started + timedelta(hours=1)):
            s.add(
                DetectionRow(
                    agent_id="support-bot",
                    agent_version="v2",
                    signal="forbidden_tool",
                    baseline="version:v1",
                    baseline_rate=0.01,
                    rate=0.1,
                    observations=100,
                    statistic=13.0,
                    threshold=12.9,
                    started_at=started,
                    ended_at=ended,
                    end_reason="recovered" if ended else None,
                )
            )
    with make_client(rt) as c:
        assert c.post("/v1/conversations", content=b"{not json", headers=INGEST).status_code == 400
        dead = c.get("/v1/dead-letters", headers=ADMIN).json()
        assert abs(utc(dead[0]["created_at"]) - datetime.now(UTC)) < timedelta(minutes=5)
        alerts = c.get("/v1/alerts", params={"active": "false"}, headers=REVIEWER).json()
        assert utc(alerts["past"][0]["started_at"]) == started
        assert utc(alerts["past"][0]["ended_at"]) == started + timedelta(hours=1)
        active = c.get("/v1/alerts", headers=REVIEWER).json()["active"]
        assert utc(active[0]["started_at"]) == started and active[0]["ended_at"] is None
    rt.close()


def test_a_conversations_times_read_the_same_in_the_list_and_on_its_own(db_url) -> None:
    """The list answered `...Z` and, once the conversation route wrote its answer with orjson, the
    conversation itself `...+00:00`: one field, two formats. Every answer writes UTC as `Z`."""
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    conv = {
        "conversation_id": "tz-1",
        "agent_id": "support-bot",
        "agent_version": "v1",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    }
    with make_client(rt, {"api"}) as c:
        assert c.post("/v1/conversations", json=conv, headers=INGEST).status_code in (200, 201, 202)
        listed = c.get("/v1/conversations", headers=REVIEWER).json()["items"][0]["received_at"]
        one = c.get("/v1/conversations/tz-1", headers=REVIEWER).json()
        assert listed.endswith("Z") and one["received_at"] == listed, (listed, one["received_at"])
        utc(one["received_at"])


def test_judge_answers_carry_utc(db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Verdicts, pairwise comparisons and a judge's state time were written bare on SQLite
    (``"created_at": "2026-12-06T19:03:55.751579"``: no zone), on /v1/verdicts, a conversation's verdicts,
    /v1/judges, /v1/overview and the pairwise list, while every other answer says UTC."""
    import asyncio

    from tests.support.judge_fakes import judge_dir
    from vigil.ingest.simulate import Simulator, parse_versions
    from vigil.judge import store
    from vigil.judge.wiring import wire
    from vigil.schema import Conversation

    jd = judge_dir(tmp_path / "judges", sampling={"rate": 1.0})
    settings = make_settings(db_url, judges_dir=str(jd), judge_mode="offline")
    worker_rt = build_runtime(settings, registry=CollectorRegistry())
    worker_rt.roles = frozenset({"judge-worker"})
    stage = wire(worker_rt)
    convs = [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:0.5"), 3).stream(2)]
    worker_rt.pipeline.process(convs, "test")
    asyncio.run(stage.worker.run_until_idle(20))
    worker_rt.close()
    rt = build_runtime(settings, registry=CollectorRegistry())
    with rt.sessions.begin() as s:  # the state a worker process stored, as an API process reads it
        store.save_status(s, "tj", "running", "ok", "host:1", datetime.now(UTC))
    with make_client(rt, {"api"}) as c:
        body = {"input": "capital of France", "answer_a": "Paris.", "answer_b": "No idea"}
        assert c.post("/v1/judges/tj/pairwise", json=body, headers=REVIEWER).status_code == 200
        verdicts = c.get("/v1/verdicts", headers=REVIEWER).json()["items"]
        one = c.get(f"/v1/conversations/{convs[0].conversation_id}", headers=REVIEWER).json()["verdicts"]
        [judge] = c.get("/v1/judges", headers=REVIEWER).json()
        [overview] = c.get("/v1/overview", headers=REVIEWER).json()["judges"]
        [pair] = c.get("/v1/judges/tj/pairwise", headers=REVIEWER).json()["items"]
    rt.close()
    assert len(verdicts) == 2 and one
    recent = datetime.now(UTC) - timedelta(minutes=10)
    for text in [v["created_at"] for v in verdicts + one] + [judge["state_since"], pair["created_at"]]:
        assert utc(text) > recent
    assert overview["state_since"] == judge["state_since"]


def test_compare_and_quality_write_utc_as_z_like_every_other_answer(sqlite_url) -> None:
    """/v1/compare and /v1/quality wrote their window as `...+00:00` while every other answer (the
    conversations, dead letters, queue, overview) writes `...Z`."""
    from vigil.ingest.simulate import Simulator, parse_versions

    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    convs = list(Simulator(parse_versions("v1:0.5,v2:0.5"), 3).stream(40))
    with make_client(rt, {"api"}) as c:
        for conv in convs:
            assert c.post("/v1/conversations", json=conv, headers=INGEST).status_code in (200, 201, 202)
        listed = c.get("/v1/conversations", headers=REVIEWER).json()["items"][0]["received_at"]
        compared = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER)
        agent = convs[0]["agent_id"]
        quality = c.get("/v1/quality", params={"agent": agent, "version": "v1"}, headers=REVIEWER)
    rt.close()
    assert listed.endswith("Z"), listed
    for answer in (compared, quality):
        assert answer.status_code == 200, answer.text
        since = answer.json()["window"]["since"]
        assert since.endswith("Z"), (answer.url, since)
        utc(since)
