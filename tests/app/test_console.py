"""The console's home, alerts and quality pages and their JSON, on a seeded week with a live regression."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from sqlalchemy import delete, func, select, update
from typer.testing import CliRunner

from tests.support.app import REVIEWER
from tests.support.console import AGENT, BASELINE, CANDIDATE, console_runtime, raise_alert, seed_week
from tests.support.services import postgres_database
from vigil.app.home import charts, now, quality
from vigil.app.home.pages import _wider
from vigil.calibration.overview import Calibration
from vigil.calibration.stats import agreement_from_counts
from vigil.detector.models import DetectionRow, QualityCountRow
from vigil.detector.pages import AlertBanner, chart_range
from vigil.store.models import ConversationRow, ReviewItemRow, VerdictRow
from vigil.ui.links import quality_link

pytestmark = pytest.mark.slow  # a week of traffic is seeded once per module


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list[DetectionRow]]]:
    rt = console_runtime(f"sqlite:///{tmp_path_factory.mktemp('console') / 'vigil.db'}")
    seed_week(rt, per_hour=4)
    alerts = raise_alert(rt)
    yield rt, alerts
    rt.close()


def client(rt: Any, raise_server_exceptions: bool = True) -> Any:
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app

    return TestClient(build_app(rt), raise_server_exceptions=raise_server_exceptions)


def logged_in(rt: Any, raise_server_exceptions: bool = True) -> Any:
    c = client(rt, raise_server_exceptions)
    token = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/login").text)
    assert token
    c.post("/ui/login", data={"csrf": token.group(1), "api_key": "rita-key", "next": "/ui"})
    return c


def test_root_goes_to_the_console_and_errors_are_pages_under_ui_only(seeded, monkeypatch) -> None:
    rt, _ = seeded
    c = client(rt)
    r = c.get("/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/ui"
    r = c.get("/ui", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")

    c = logged_in(rt)
    r = c.get("/ui/nope")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert "Page not found" in r.text and "/ui/nope" in r.text and '{"detail"' not in r.text
    assert r.headers["content-security-policy"].startswith("default-src 'none'")
    assert c.get("/v1/nope").json() == {"detail": "Not Found"}
    r = c.get("/ui/queue?page=abc")
    assert r.status_code == 400 and "page" in r.text and "text/html" in r.headers["content-type"]
    assert c.get("/ui/static/nope.js").status_code == 404

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("boom")

    failing = logged_in(rt, raise_server_exceptions=False)
    monkeypatch.setattr(now, "snapshot", broken)
    r = failing.get("/ui")
    assert r.status_code == 500 and "Something went wrong" in r.text and "RuntimeError" in r.text
    r = failing.get("/v1/overview", headers=REVIEWER)
    assert r.status_code == 500 and r.json() == {"detail": "internal error: RuntimeError"}


def test_home_says_what_is_happening_now(seeded) -> None:
    rt, alerts = seeded
    c = logged_in(rt)
    page = c.get("/ui").text
    # the seeded regression raised a rule's alert and the forbidden_tool aggregate of the same conversations:
    # one item, the aggregate named on it (the overview's JSON below keeps both)
    rule = next(a for a in alerts if a.signal.startswith("rule:"))
    assert f'id="home-alert-{rule.id}"' in page and page.count('class="alert-item"') == 1
    assert "(also raised as <code>forbidden_tool</code>: the same conversations)" in page
    assert "/ui/queue?agent=support-bot&amp;version=v1.5.0&amp;signal=rule%3Ano-cancel-delivered-order" in page
    assert "/ui/compare?agent=support-bot&amp;baseline=v1.4.0&amp;candidate=v1.5.0" in page
    assert page.count('class="alert-banner"') == 1

    data = c.get("/v1/overview", headers=REVIEWER).json()
    assert {a["signal"] for a in data["alerts"]} == {a.signal for a in alerts}
    at = datetime.now(UTC)
    day = (at - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)  # the day counts whole hours
    with rt.sessions() as s:

        def stored(since: datetime) -> dict[str, int]:
            q = select(ConversationRow.agent_version, func.count()).where(ConversationRow.received_at >= since)
            return dict(s.execute(q.group_by(ConversationRow.agent_version)).all())  # type: ignore[arg-type]

        def flagged(since: datetime) -> dict[str, int]:
            q = select(ReviewItemRow.agent_version, func.count()).where(ReviewItemRow.created_at >= since)
            return dict(s.execute(q.group_by(ReviewItemRow.agent_version)).all())  # type: ignore[arg-type]

        hour, last_day = stored(at - timedelta(hours=1)), stored(day)
        flagged_hour, flagged_day = flagged(at - timedelta(hours=1)), flagged(at - timedelta(days=1))
        # the seeded week's items, those its outcomes flagged too, entered the queue when their conversation
        # was received: a day's flag rate is that day's, not the whole week's outcomes counted today
        late = (
            select(func.count())
            .select_from(ReviewItemRow)
            .join(ConversationRow, ConversationRow.conversation_id == ReviewItemRow.conversation_id)
        )
        late = late.where(
            ReviewItemRow.agent_version == BASELINE, ReviewItemRow.created_at != ConversationRow.received_at
        )
        assert s.scalar(late) == 0
    by_version = {t["version"]: t for t in data["traffic"]}
    assert by_version[BASELINE]["conversations"] == {"hour": hour.get(BASELINE, 0), "day": last_day[BASELINE]}
    assert by_version[CANDIDATE]["conversations"] == {"hour": hour[CANDIDATE], "day": last_day[CANDIDATE]}
    assert by_version[CANDIDATE]["flagged"] == {"hour": flagged_hour[CANDIDATE], "day": flagged_day[CANDIDATE]}
    assert by_version[BASELINE]["flagged"]["day"] == flagged_day[BASELINE] > 0
    assert by_version[CANDIDATE]["flag_rate"]["hour"] == pytest.approx(flagged_hour[CANDIDATE] / hour[CANDIDATE])
    queued = flagged_hour[CANDIDATE]
    assert data["queue"]["open"] >= queued and data["queue"]["labelled"] == {"hour": 0, "day": 0}
    assert {j["name"] for j in data["judges"]} == set(rt.judges)
    assert all(j["budget_usd"] > 0 and j["spent_today_usd"] == 0 for j in data["judges"])

    result = CliRunner().invoke(_cli(), ["status", "--json"], env={"VIGIL_DATABASE_URL": rt.settings.database_url_str})
    assert result.exit_code == 0, result.output
    assert '"alerts"' in result.stdout and CANDIDATE in result.stdout
    # --json prints the same data as the API, times in the same form ("...Z", not "+00:00")
    assert json.loads(result.stdout)["alerts"] == data["alerts"]
    listed = CliRunner().invoke(_cli(), ["alerts", "--json"], env={"VIGIL_DATABASE_URL": rt.settings.database_url_str})
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == c.get("/v1/alerts", headers=REVIEWER).json()


def _cli() -> Any:
    from vigil.app.cli import app

    return app


def test_alerts_page_and_banner_follow_the_detections(seeded) -> None:
    rt, alerts = seeded
    c = logged_in(rt)
    page = c.get("/ui/alerts").text
    for a in alerts:
        assert f'id="alert-{a.id}"' in page
    assert "CUSUM statistic" in page and "Baseline (version:v1.4.0)" in page
    # the seeded regression (deliveries cancelled) is one rule's: the forbidden_tool aggregate counts the same
    # conversations, raised in the same run. One card and one banner line, the aggregate named on the rule's
    by_signal = {a.signal: a for a in alerts}
    assert set(by_signal) == {"forbidden_tool", "rule:no-cancel-delivered-order"}
    rule, aggregate = by_signal["rule:no-cancel-delivered-order"], by_signal["forbidden_tool"]
    assert page.count('class="card alert-card') == 1
    assert ">Its conversations in the queue</a>" in page  # the rule's: the queue filters to it
    assert f'<p class="small twin" id="alert-{aggregate.id}">Also raised as <code>forbidden_tool</code>' in page
    banner = next(b for b in rt.hooks.banners if isinstance(b, AlertBanner))  # as wired
    assert [b["href"] for b in banner()] == [f"/ui/alerts#alert-{rule.id}"]
    with rt.sessions.begin() as s:
        s.execute(update(DetectionRow).where(DetectionRow.id == rule.id).values(ended_at=datetime.now(UTC)))
    try:
        # the rule's alert ended: the aggregate's stands on its own
        assert [b["href"] for b in banner()] == [f"/ui/alerts#alert-{aggregate.id}"]
        page = c.get("/ui/alerts").text
        assert f'id="alert-{rule.id}"' not in page and page.count('class="card alert-card') == 1
        # the queue has no filter for forbidden_tool: its button says it lists the version's queue
        assert ">This version&#39;s queue</a>" in page and "Its conversations in the queue" not in page
        assert ">This version&#39;s queue</a>" in c.get("/ui").text
        assert f'id="alert-{rule.id}"' in c.get("/ui/alerts?show=all").text
    finally:
        with rt.sessions.begin() as s:
            s.execute(update(DetectionRow).where(DetectionRow.id == rule.id).values(ended_at=None))


def test_alerts_page_narrows_to_the_labels_of_a_notifications_alert(seeded) -> None:
    """A notification names agent, agent_version and signal; /ui/alerts ignored them and listed every
    alert, and one that had ended meanwhile only behind "Show past alerts"."""
    rt, alerts = seeded
    c = logged_in(rt)
    by_signal = {a.signal: a for a in alerts}
    rule = by_signal["rule:no-cancel-delivered-order"]
    # the aggregate's alert (ForbiddenToolCallsRising) lands on the rule's card it is folded into
    page = c.get("/ui/alerts", params={"agent": AGENT, "version": CANDIDATE, "signal": "forbidden_tool"}).text
    assert f'id="alert-{rule.id}"' in page and page.count('class="card alert-card') == 1
    assert 'id="narrowed"' in page
    other = c.get("/ui/alerts", params={"agent": AGENT, "version": BASELINE}).text
    assert 'class="card alert-card' not in other and "no past ones" in other
    assert 'class="card alert-card' not in c.get("/ui/alerts", params={"signal": "rule:pii-in-reply"}).text
    with rt.sessions.begin() as s:
        s.execute(update(DetectionRow).where(DetectionRow.id == rule.id).values(ended_at=datetime.now(UTC)))
    try:  # ended since the notification: still there, among the past ones
        page = c.get("/ui/alerts", params={"version": CANDIDATE, "signal": rule.signal}).text
        assert f'id="alert-{rule.id}"' in page and ">ended<" in page
    finally:
        with rt.sessions.begin() as s:
            s.execute(update(DetectionRow).where(DetectionRow.id == rule.id).values(ended_at=None))


def test_alerts_page_narrowed_to_a_signal_finds_it_behind_a_hundred_newer_alerts(seeded) -> None:
    """Narrowed to a signal, the page read the version's newest 100 detections and kept those of the signal:
    a notification's alert behind 100 newer ones of other signals (a version that flapped on many rules)
    was not there, and the page said the detector raised none."""
    rt, alerts = seeded
    rule = next(a for a in alerts if a.signal == "rule:no-cancel-delivered-order")
    later = datetime.now(UTC) + timedelta(hours=1)
    with rt.sessions.begin() as s:
        newer = [
            DetectionRow(
                agent_id=AGENT,
                agent_version=CANDIDATE,
                signal="rule:pii-in-reply",
                baseline="version:" + BASELINE,
                baseline_rate=0.01,
                rate=0.2,
                observations=100,
                statistic=9.0,
                threshold=5.0,
                started_at=later + timedelta(minutes=i),
                ended_at=later + timedelta(minutes=i, seconds=30),
                end_reason="recovered",
            )
            for i in range(110)
        ]
        s.add_all(newer)
    try:
        page = logged_in(rt).get("/ui/alerts", params={"agent": AGENT, "version": CANDIDATE, "signal": rule.signal})
        assert f'id="alert-{rule.id}"' in page.text
        assert page.text.count('class="card alert-card') == 1
    finally:
        with rt.sessions.begin() as s:
            s.execute(delete(DetectionRow).where(DetectionRow.id.in_([d.id for d in newer])))


def test_an_alerts_intervals_carry_their_unit(seeded) -> None:
    """The rates read "30.00% [21.89, 39.58]": the interval's bounds had no unit and nothing said what
    interval it was."""
    rt, _alerts = seeded
    page = logged_in(rt).get("/ui/alerts").text
    bounds = re.findall(r'<span class="muted">\[([^\]]*)\] · ', page)
    assert len(bounds) >= 3  # raised, now, baseline
    assert all(re.fullmatch(r"\d+\.\d\d%, \d+\.\d\d%", b) for b in bounds), bounds
    assert "95% Wilson interval" in page


def test_a_charts_alert_count_links_to_those_alerts(seeded) -> None:
    """A chart said "1 alert" in plain text: the alert's evidence was a trip through the menu away."""
    rt, alerts = seeded
    c = logged_in(rt)
    page = c.get("/ui/quality", params={"agent": AGENT, "version": CANDIDATE, "last": "7d"}).text
    signal = "rule:no-cancel-delivered-order"
    wanted = "/ui/alerts?" + urlencode({"agent": AGENT, "version": CANDIDATE, "signal": signal})
    assert f' · <a class="bad to-alerts" href="{wanted.replace("&", "&amp;")}">1 alert</a>' in page
    assert f'id="alert-{next(a.id for a in alerts if a.signal == signal)}"' in c.get(wanted).text


def test_quality_series_count_every_stored_conversation_with_intervals(seeded) -> None:
    rt, _ = seeded
    c = client(rt)
    r = c.get("/v1/quality/series", params={"agent": AGENT, "version": BASELINE}, headers=REVIEWER)
    assert r.status_code == 200
    body = r.json()
    assert body["bucket_hours"] == 2
    series = {s["signal"]: s for s in body["series"]}
    assert {"forbidden_tool", "tool_error", f"rule:{'no-cancel-delivered-order'}"} <= set(series)
    assert any(sig.startswith("outcome:") for sig in series)
    since, until = (datetime.fromisoformat(body[k]) for k in ("since", "until"))
    start = since.replace(minute=0, second=0, microsecond=0)
    with rt.sessions() as s:
        counted = s.scalar(
            select(func.sum(QualityCountRow.n)).where(
                QualityCountRow.agent_version == BASELINE,
                QualityCountRow.signal == "tool_error",
                QualityCountRow.hour >= start,
                QualityCountRow.hour < until,
            )
        )
    points = series["tool_error"]["points"]
    assert sum(p["n"] for p in points) == counted > 0
    for p in points:
        if p["n"]:
            assert p["low"] <= p["rate"] <= p["high"]
        else:
            assert p["rate"] is None
    assert series["tool_error"]["total"]["n"] == counted

    candidate = c.get("/v1/quality/series", params={"agent": AGENT, "version": CANDIDATE}, headers=REVIEWER).json()
    flagged = {s["signal"]: s for s in candidate["series"]}
    assert flagged["forbidden_tool"]["alerts"] and flagged["forbidden_tool"]["alerts"][0]["end"] is None

    bad = c.get("/v1/quality/series", params={"agent": AGENT, "version": BASELINE, "since": "soon"}, headers=REVIEWER)
    assert bad.status_code == 422 and "not a date and time" in bad.json()["detail"]
    early = {"agent": AGENT, "version": BASELINE, "until": "0001-01-01"}
    bad = c.get("/v1/quality/series", params=early, headers=REVIEWER)
    assert bad.status_code == 422 and "leaves no 7d" in bad.json()["detail"]
    assert c.get("/v1/quality/series", params={"agent": AGENT, "version": BASELINE}).status_code == 401


def test_quality_page_says_when_it_shows_another_version_than_the_one_asked_for(seeded) -> None:
    rt, _ = seeded
    c = logged_in(rt)
    asked = c.get("/ui/quality", params={"agent": AGENT, "version": BASELINE, "last": "7d"}).text
    assert "No counts of" not in asked and f'value="{BASELINE}" selected' in asked
    # an address kept from before (a version no longer counted) or mistyped: its charts are another's
    gone = c.get("/ui/quality", params={"agent": AGENT, "version": "v0-retired", "last": "7d"})
    assert gone.status_code == 200
    with rt.sessions() as s:
        newest = quality.versions(s)[AGENT][0]
    assert f"No counts of {AGENT} version &#39;v0-retired&#39;: showing {newest}." in gone.text
    other = c.get("/ui/quality", params={"agent": "nobody", "version": BASELINE}).text
    assert "No counts of agent &#39;nobody&#39;: showing" in other


def test_judge_rate_is_charted_raw_and_corrected(seeded, monkeypatch) -> None:
    rt, _ = seeded
    judge = next(iter(rt.judges))
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    with rt.sessions.begin() as s:
        s.add(QualityCountRow(agent_id=AGENT, agent_version=BASELINE, signal=f"judge:{judge}", hour=hour, n=200, x=40))
    until = datetime.now(UTC)
    raw = {s.kind: s for s in quality.quality(rt, AGENT, BASELINE, until - timedelta(days=1), until)}
    assert raw["judge"].total["rate"] == pytest.approx(0.2) and "judge_corrected" not in raw
    assert raw["judge"].note and "No corrected rate" in raw["judge"].note

    # a judge that flags 90% of true failures and 10% of good conversations: 20% raw is 12.5% corrected
    monkeypatch.setattr(Calibration, "measured", lambda self, s, name: agreement_from_counts(90, 10, 10, 90))
    both = {s.kind: s for s in quality.quality(rt, AGENT, BASELINE, until - timedelta(days=1), until)}
    corrected = both["judge_corrected"]
    assert corrected.total["rate"] == pytest.approx(0.125)
    point = next(p for p in corrected.points if p.n)
    assert point.low is not None and point.high is not None and point.low < 0.125 < point.high


def _verdict(judge: str, version: str, at: datetime, offline: bool) -> VerdictRow:
    return VerdictRow(
        judge=judge,
        judge_version="1",
        conversation_id=f"c-{version}-{at:%H%M%S}-{offline}",
        revision=1,
        agent_id=AGENT,
        agent_version=version,
        verdict="fail",
        categories=[],
        model="offline-judge" if offline else "gpt",
        offline=offline,
        prompt_hash="h",
        reason="sampled",
        created_at=at,
    )


def test_an_offline_judges_rate_says_so_in_its_chart_title(seeded, monkeypatch) -> None:
    """The detector counts a judge's verdicts as one signal; the chart names the offline judge (or says the
    range pools both modes) instead of passing heuristic verdicts off as the model's."""
    rt, _ = seeded
    judge = next(iter(rt.judges))
    version = "v-offline-title"
    until = datetime.now(UTC)
    hour = until.replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    with rt.sessions.begin() as s:
        s.add(QualityCountRow(agent_id=AGENT, agent_version=version, signal=f"judge:{judge}", hour=hour, n=200, x=40))
        s.add_all([_verdict(judge, version, hour + timedelta(minutes=m), True) for m in (1, 20, 40)])
    monkeypatch.setattr(Calibration, "measured", lambda self, s, name: agreement_from_counts(90, 10, 10, 90))
    titles = {x.kind: x.title for x in quality.quality(rt, AGENT, version, until - timedelta(days=1), until)}
    assert titles == {
        "judge": f"Offline judge {judge}: failure rate",
        "judge_corrected": f"Offline judge {judge}: failure rate, corrected",
    }
    with rt.sessions.begin() as s:
        s.add(_verdict(judge, version, hour + timedelta(minutes=50), False))  # the model judge took over
    [raw] = [x for x in quality.quality(rt, AGENT, version, until - timedelta(days=1), until) if x.kind == "judge"]
    assert raw.title == f"Judge {judge} (offline and model verdicts pooled): failure rate"
    # a range with only the model's verdicts keeps the plain title
    model_only = quality.quality(rt, AGENT, version, hour + timedelta(minutes=45), until)
    assert [x.title for x in model_only if x.kind == "judge"] == [f"Judge {judge}: failure rate"]


def test_time_range_and_chart_geometry() -> None:
    t0 = datetime(2026, 11, 24, tzinfo=UTC)
    assert quality.time_range(None, None, "24h", t0)[:2] == (t0 - timedelta(hours=24), t0)
    assert quality.time_range("2026-11-20", "2026-11-21T06:00", None, t0)[:2] == (
        datetime(2026, 11, 20, tzinfo=UTC),
        datetime(2026, 11, 21, 6, tzinfo=UTC),
    )
    with pytest.raises(quality.RangeError, match="before"):
        quality.time_range("2026-11-22", "2026-11-21", None, t0)
    with pytest.raises(quality.RangeError, match="at most"):
        quality.time_range("2025-01-01", None, None, t0)
    with pytest.raises(quality.RangeError, match="leaves no 7d"):  # was an OverflowError: a 500
        quality.time_range(None, "0001-01-01", None, t0)
    assert quality.time_range("0001-01-01", "0001-01-03", None, t0)[1] == datetime(1, 1, 3, tzinfo=UTC)
    assert quality.bucket_for(timedelta(days=1)) == timedelta(hours=1)
    assert quality.bucket_for(timedelta(days=30)) == timedelta(hours=12)
    assert charts.nice_max(0.003) == 0.01 and charts.nice_max(0.13) == 0.2 and charts.nice_max(0.9) == 1.0

    pts = [
        charts.Point(t0 + timedelta(hours=h), 10 if h != 2 else 0, 1, 0.1 if h != 2 else None, 0.02, 0.4)
        for h in range(5)
    ]
    span = charts.Span(t0 + timedelta(hours=3), None, "alert #1")
    d = charts.draw(pts, [span], t0, t0 + timedelta(hours=5))
    assert len(d.dots) == 4 and d.line.count("M") == 2 and len(d.band) == 2  # the empty bucket breaks the line
    ((x, width, _),) = d.marks
    assert x == pytest.approx(charts.LEFT + 0.6 * (charts.WIDTH - charts.RIGHT - charts.LEFT), abs=0.2)
    assert x + width == pytest.approx(charts.WIDTH - charts.RIGHT)  # an active alert runs to the right edge
    assert d.ymax == 0.5 and d.yticks[-1][1] == "50%"


def test_home_and_quality_read_postgres() -> None:
    with postgres_database() as url:
        rt = console_runtime(url)
        try:
            seed_week(rt, per_hour=10, days=1)
            raise_alert(rt)
            snap = now.as_json(now.snapshot(rt))
            assert snap["alerts"] and {t["version"] for t in snap["traffic"]} == {BASELINE, CANDIDATE}
            until = datetime.now(UTC)
            series = quality.quality(rt, AGENT, BASELINE, until - timedelta(days=2), until)
            assert series and sum(p.n for p in series[0].points) > 0
        finally:
            rt.close()


def test_a_canary_without_outcomes_yet_is_not_flagged_for_them(seeded) -> None:
    """The seeded canary's conversations are minutes old and have no outcomes: its outcome rows say "no data"
    (task success counts graded trials, the others wait for their outcomes) and no red flag names them."""
    rt, _ = seeded
    c = logged_in(rt)
    body = c.get("/v1/compare", params={"baseline": BASELINE, "candidate": CANDIDATE}, headers=REVIEWER).json()
    rows = {r["signal"]: r for r in body["signals"]}
    outcome_rows = [r for s, r in rows.items() if s.startswith("outcome:")]
    assert {r["signal"] for r in outcome_rows} >= {"outcome:task_success", "outcome:thumbs_up"}
    for r in outcome_rows:
        assert r["verdict"] == "no data" and r["candidate"]["n"] == 0, r
        assert r["baseline"]["n"] > 0 and r["baseline"]["value"] > 0, r
    assert rows["forbidden_tool"]["verdict"] == "worse"  # the real regression still shows
    labels = {r["label"] for r in outcome_rows}  # "task_success rate", "thumbs_up rate", ...
    assert body["red_flags"] and not any(n.startswith(tuple(labels)) for n in body["red_flags"])


def _alert(i: int, signal: str, x: int, n: int = 1000, version: str = "v2", active: bool = True) -> dict[str, Any]:
    return {
        "id": i,
        "signal": signal,
        "agent_id": "bot",
        "agent_version": version,
        "started_at": datetime(2026, 12, 6, 5, 48, tzinfo=UTC),
        "rate_at_start": x / n,
        "observations_at_start": n,
        "active": active,
    }


def test_only_an_aggregate_alert_repeating_a_rule_that_feeds_it_is_folded() -> None:
    from vigil.detector.twins import fold_twins

    alert = _alert
    fed_by = {"forbidden_tool": frozenset({"rule:no-refund", "rule:no-delete"})}  # rules of type forbidden_tool
    alerts = [
        alert(1, "forbidden_tool", 30),  # the same count as rule:no-refund: the same conversations, folded
        alert(2, "rule:pii", 30),  # not a forbidden-tool rule: an equal count is a coincidence
        alert(3, "rule:no-refund", 30),
        alert(4, "tool_error", 7),  # counts tool results, not findings: never folded
        alert(5, "rule:tool-errors", 7),
        alert(6, "forbidden_tool", 30, version="v3"),  # another version: stands
        alert(7, "forbidden_tool", 12, version="v4"),  # two rules add up to it, neither alone: stands
        alert(8, "rule:no-delete", 5, version="v4"),
        alert(9, "rule:no-refund", 7, version="v4"),
        alert(10, "forbidden_tool", 40, version="v5", active=False),  # ended while the rule's stands
        alert(11, "rule:no-delete", 40, version="v5"),
    ]
    shown = fold_twins(alerts, fed_by)
    assert [a["id"] for a in shown] == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert [t["id"] for t in shown[1]["twins"]] == [1]
    assert all("twins" not in a for a in shown if a["id"] != 3)
    assert [a["id"] for a in fold_twins(alerts[:3], {})] == [1, 2, 3]  # no rule feeds it: nothing folded
    # the fold follows what feeds each aggregate, not the name forbidden_tool: an aggregate fed by other
    # rules folds into them alone, each into its own rule
    fed_by = {**fed_by, "any_pii": frozenset({"rule:pii"})}
    more = [alert(1, "forbidden_tool", 30), alert(2, "rule:pii", 30), alert(3, "rule:no-refund", 30)]
    more.append(alert(12, "any_pii", 30))
    shown = fold_twins(more, fed_by)
    assert [(a["id"], [t["id"] for t in a.get("twins", [])]) for a in shown] == [(2, [12]), (3, [1])]


def test_the_shipped_rules_fold_forbidden_tool_only_into_forbidden_tool_rules() -> None:
    """What feeds each aggregate, read from the rule packs: the rules of type ``forbidden_tool`` feed
    ``forbidden_tool``; ``tool-errors`` (``tool_error_rate``) does not feed ``tool_error``, nor does any
    other kind (budget, user_repetition, pii_leak, groundedness, require_confirmation, tool_order, ...) feed
    an aggregate: each of those regressions raises its rule's alert alone."""
    from vigil.detector.twins import fed_by_rules
    from vigil.rules import RuleEngine
    from vigil.settings import PROJECT_ROOT

    rules = RuleEngine.from_paths(sorted((PROJECT_ROOT / "rules").glob("*.yaml")))
    fed_by = fed_by_rules(rules)
    forbidden = {f"rule:{r.id}" for r in rules.rules if r.type.name == "forbidden_tool"}
    assert len(forbidden) > 1 and fed_by == {"forbidden_tool": forbidden}
    kinds = {r.type.name for r in rules.rules}
    assert {"tool_error_rate", "budget", "user_repetition", "pii_leak", "tool_order"} <= kinds


def test_status_shows_a_judge_budget_under_a_cent(capsys: pytest.CaptureFixture[str]) -> None:
    from vigil.app.home.commands import print_status

    judge = {"name": "cheap", "spent_today_usd": 0.0042, "budget_usd": 0.005, "state": "paused"}
    print_status(
        {"alerts": [], "traffic": [], "queue": {"open": 0, "labelled": {"hour": 0, "day": 0}}, "judges": [judge]}
    )
    assert "judge cheap: $0.0042 of $0.005 today (paused)" in capsys.readouterr().out


def test_every_empty_state_says_what_to_do_next(tmp_path) -> None:
    """ "No labels yet." on Progress led nowhere, and "Show past alerts (0)" linked to an empty list: each
    empty page now names its next step (a link where there is a page for it)."""
    rt = console_runtime(f"sqlite:///{tmp_path / 'empty.db'}", judges_dir=str(tmp_path / "no-judges"))
    try:
        c = logged_in(rt)
        pages = {
            path: c.get(path)
            for path in (
                "/ui",
                "/ui/progress",
                "/ui/alerts",
                "/ui/export",
                "/ui/clusters",
                "/ui/calibration",
                "/ui/compare",
            )
        }
    finally:
        rt.close()
    for path, r in pages.items():
        assert r.status_code == 200, path
    html = {path: r.text for path, r in pages.items()}
    assert re.search(r'id="no-labels">No labels yet\. <a href="/ui/queue">', html["/ui/progress"])
    assert "show=all" not in html["/ui/alerts"] and 'id="no-past">No past alerts<' in html["/ui/alerts"]
    assert re.search(r'id="no-exports">[^<]*<a href="/ui/queue">', html["/ui/export"])
    assert re.search(r'id="no-clusters">[^<]*<a href="/ui/queue">', html["/ui/clusters"])
    assert re.search(r'id="no-failures">[^<]*<a href="/ui/queue">', html["/ui/clusters"])
    assert "VIGIL_JUDGES_DIR" in html["/ui/calibration"] and "VIGIL_JUDGES_DIR" in html["/ui"]
    assert re.search(r'id="no-traffic">[^<]*<a href="/ui/conversations">', html["/ui"])
    assert "POST /v1/conversations" in html["/ui/compare"]


def test_a_mistyped_agent_or_version_names_the_known_ones(seeded) -> None:
    """A mistyped agent or version said only "No stored conversation matches", while the fields' suggestions
    knew the agents and versions: the empty list names them."""
    rt, _ = seeded
    c = logged_in(rt)
    html = c.get("/ui/conversations", params={"agent": "suport-bot"}).text
    assert "No stored conversation matches." in html
    assert f"No agent &#39;suport-bot&#39; is known; agents: {AGENT}." in html
    html = c.get("/ui/conversations", params={"agent": AGENT, "version": "v1.5"}).text
    named = re.search(r"No version &#39;v1\.5&#39; is known; ([^:]+)&#39;s versions: ([^<]+)\.<", html)
    assert named and named.group(1) == AGENT and {BASELINE, CANDIDATE} <= set(named.group(2).split(", "))
    assert '<a href="/ui/conversations">Clear the filters</a>' in html
    html = c.get("/ui/conversations", params={"version": "v9"}).text
    assert "No version &#39;v9&#39; is known; versions: " in html
    matched = c.get(
        "/ui/conversations", params={"agent": AGENT, "version": CANDIDATE, "until": "2000-01-01T00:00"}
    ).text
    assert "No stored conversation matches." in matched and "is known" not in matched  # known names: nothing to say


def test_an_alerts_chart_link_frames_the_regression(seeded) -> None:
    """A card's "Chart" opened the default week: a canary's regression of the last hours was a dot or two at
    the right edge. The link now starts shortly before the hours the card's evidence holds."""
    rt, alerts = seeded
    c = logged_in(rt)
    rule = next(a for a in alerts if a.signal == "rule:no-cancel-delivered-order")
    page = c.get("/ui/alerts").text
    card = page[page.index(f'id="alert-{rule.id}"') :]
    href = re.search(r'<a class="button" href="([^"]+)">Chart</a>', card)
    assert href, card[:2000]
    link = urlsplit(href.group(1).replace("&amp;", "&"))
    params = parse_qs(link.query)
    assert "until" not in params and "last" not in params  # active: up to now
    since = datetime.fromisoformat(params["since"][0]).replace(tzinfo=UTC)
    started = rule.started_at.replace(tzinfo=UTC) if rule.started_at.tzinfo is None else rule.started_at
    assert started - timedelta(hours=14) <= since <= started - timedelta(hours=2)
    chart = c.get(f"{link.path}?{link.query}")
    assert (
        chart.status_code == 200
        and "per 1 h" in chart.text
        and 'id="signal-rule-no-cancel-delivered-order"' in chart.text
    )


def test_an_ended_alerts_chart_link_ends_after_it() -> None:
    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    first = {"hour": datetime(2026, 12, 1, 3, 0, tzinfo=UTC)}
    alert = {
        "started_at": datetime(2026, 12, 1, 9, 30, tzinfo=UTC),
        "ended_at": datetime(2026, 12, 2, 1, 5, tzinfo=UTC),
    }
    assert chart_range({**alert, "evidence": {"hours": [first]}}, now) == {
        "since": "2026-12-01T01:00",
        "until": "2026-12-02T03:05",
    }
    assert chart_range({**alert, "evidence": {"hours": []}}, now)["since"] == "2026-12-01T07:00"
    old = {"started_at": now - timedelta(days=200), "ended_at": None, "evidence": {"hours": []}}
    assert chart_range(old, now) == {"since": f"{now - timedelta(days=92):%Y-%m-%dT%H:%M}"}  # the longest chart


def test_a_quality_range_without_traffic_links_to_a_wider_one_and_the_conversations(seeded) -> None:
    """ "No traffic of … in this range" was a dead end: it links to a longer range and to the version's list."""
    rt, _ = seeded
    c = logged_in(rt)
    params = {"agent": AGENT, "version": CANDIDATE, "since": "2020-01-01T00:00", "until": "2020-01-02T00:00"}
    html = c.get("/ui/quality", params=params).text
    wider = quality_link(AGENT, CANDIDATE, since="2019-12-26T00:00", until="2020-01-02T00:00")
    listed = "/ui/conversations?" + urlencode({"agent": AGENT, "version": CANDIDATE})
    assert (
        f'id="no-traffic">No traffic of {AGENT} {CANDIDATE} in this range: <a href="{wider.replace("&", "&amp;")}">'
        f'show the last 7d</a>, or <a href="{listed.replace("&", "&amp;")}">list its stored conversations</a>.'
    ) in html
    assert CANDIDATE in c.get(listed).text
    end = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    assert _wider("a", "v", end - timedelta(days=7), end, None) == (quality_link("a", "v", last="30d"), "30d")
    assert _wider("a", "v", end - timedelta(days=30), end, None)[1] == "92d"
    assert _wider("a", "v", end - timedelta(days=92), end, None) is None
    # a range at the start of the calendar has nothing wider before it: the page says so, it is no 500
    first = datetime(1, 1, 1, 0, 1, tzinfo=UTC)
    assert _wider("a", "v", first - timedelta(minutes=1), first, "0001-01-01T00:01") is None
    early = {"agent": AGENT, "version": CANDIDATE, "since": "0001-01-01T00:00:00", "until": "0001-01-01T00:00:01"}
    page = c.get("/ui/quality", params=early)
    assert page.status_code == 200 and "No traffic of" in page.text


def test_the_alerts_pages_past_alerts_control_keeps_to_one_line() -> None:
    """Beside the page's long lead, "No past alerts" was squeezed onto two lines at desktop width."""
    from pathlib import Path

    import vigil

    root = Path(vigil.__file__).parent
    template = (root / "detector/templates/alerts.html").read_text()
    assert '<p class="head-action">{% if narrowed %}' in template
    css = (root / "ui/static/vigil.css").read_text()
    assert re.search(r"\.head-action \{[^}]*white-space: nowrap", css)
