"""An aggregate's alert raised with a rule's alert that feeds it: the API and the CLI list both and say so."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import REVIEWER, make_client, make_settings
from tests.support.cli import cli_runner
from vigil.app.runtime import build_runtime
from vigil.detector.models import DetectionRow

START = datetime(2026, 12, 6, 5, 0, tzinfo=UTC)
RULE = "rule:no-cancel-delivered-order"  # of type forbidden_tool in rules/default.yaml: it feeds forbidden_tool


@pytest.fixture
def rt(db_url):  # type: ignore[no-untyped-def]
    runtime = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    yield runtime
    runtime.close()


def raise_alerts(rt: Any, *alerts: tuple[str, str, int, datetime, bool]) -> list[int]:
    """Detections as the detector writes them: (signal, version, conversations failed of 100, start, active)."""
    rows = [
        DetectionRow(
            agent_id="support-bot",
            agent_version=version,
            signal=signal,
            baseline="version:v1",
            baseline_rate=0.01,
            rate=x / 100,
            observations=100,
            statistic=9.0,
            threshold=8.0,
            started_at=start,
            ended_at=None if active else start + timedelta(hours=3),
            end_reason=None if active else "recovered",
        )
        for signal, version, x, start, active in alerts
    ]
    with rt.sessions.begin() as s:
        s.add_all(rows)
        s.flush()
        return [r.id for r in rows]


def relations(listed: dict[str, Any]) -> dict[int, tuple[int | None, list[int]]]:
    return {a["id"]: (a["folded_into"], a["folds"]) for a in listed["active"] + listed["past"]}


def test_the_api_lists_both_twins_and_names_each_in_the_other(rt) -> None:
    aggregate, rule, pii, tool_error, tool_errors, alone, past_aggregate, past_rule = raise_alerts(
        rt,
        ("forbidden_tool", "v2", 30, START, True),
        (RULE, "v2", 30, START, True),
        ("rule:pii-in-reply", "v2", 30, START, True),  # not fed into forbidden_tool: a coincidence
        ("tool_error", "v2", 7, START, True),  # counts tool results, not findings: never folded
        ("rule:tool-errors", "v2", 7, START, True),
        ("forbidden_tool", "v3", 12, START, True),  # no rule's alert with its count: stands
        ("forbidden_tool", "v4", 20, START - timedelta(days=1), False),  # ended together: still twins
        (RULE, "v4", 20, START - timedelta(days=1), False),
    )
    with make_client(rt) as c:
        listed = c.get("/v1/alerts", headers=REVIEWER).json()
        assert relations(listed) == {
            aggregate: (rule, []),
            rule: (None, [aggregate]),
            pii: (None, []),
            tool_error: (None, []),
            tool_errors: (None, []),
            alone: (None, []),
            past_aggregate: (past_rule, []),
            past_rule: (None, [past_aggregate]),
        }
        # a page that ends between the two still names the one left off
        page = c.get("/v1/alerts", params={"active": "false", "limit": 1}, headers=REVIEWER).json()
        assert relations(page) == {past_rule: (None, [past_aggregate])}
        page = c.get("/v1/alerts", params={"version": "v2", "limit": 4}, headers=REVIEWER).json()
        assert relations(page)[rule] == (None, [aggregate]) and aggregate not in relations(page)


def test_the_cli_lists_an_aggregate_under_the_rule_alert_it_repeats(rt, monkeypatch) -> None:
    from vigil.app.cli import app
    from vigil.detector.commands import alert_rows

    aggregate, other, rule = raise_alerts(
        rt,
        ("forbidden_tool", "v2", 30, START, True),
        ("rule:pii-in-reply", "v2", 30, START, True),
        (RULE, "v2", 30, START, True),
    )
    monkeypatch.setenv("VIGIL_DATABASE_URL", rt.settings.database_url_str)
    result = cli_runner().invoke(app, ["alerts"])
    assert result.exit_code == 0, result.output
    header, *lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert header[0] == "id" and header[-1] == "folded into"
    # every alert listed (newest id first), the aggregate's right under the rule's it is folded into
    assert [(int(r[0]), r[4], r[-1]) for r in lines] == [
        (rule, RULE, ""),
        (aggregate, "forbidden_tool", str(rule)),
        (other, "rule:pii-in-reply", ""),
    ]
    listed = json.loads(cli_runner().invoke(app, ["alerts", "--json"]).stdout)
    assert relations(listed) == {aggregate: (rule, []), rule: (None, [aggregate]), other: (None, [])}
    on_terminal = alert_rows(listed["active"], indent=True)
    assert [r[4] for r in on_terminal] == [RULE, "└ forbidden_tool", "rule:pii-in-reply"]
