"""Hostile calibration input: values of the wrong JSON type are refused by item and field (422 over HTTP,
exit 2 on the command line), never a 500 or a traceback; kappa on a handful of items has no interval."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import ADMIN, make_client, make_settings
from tests.support.cli import cli_runner
from vigil.app.cli import app
from vigil.app.runtime import build_runtime
from vigil.calibration.commands import _est
from vigil.calibration.stats import agreement_from_counts, cohens_kappa, fleiss, inter_rater

JUDGE = "support-generic"
LABEL = {"conversation_id": "c1", "human": "fail"}
VERDICT = {"conversation_id": "c1", "verdict": "fail"}


@pytest.mark.parametrize(
    ("labels", "verdicts", "where"),
    [
        ([{"conversation_id": "c1", "human": ["fail"]}], [VERDICT], "labels:1: human"),
        ([{"conversation_id": "c1", "label": {"fail": 1}}], [VERDICT], "labels:1: human"),
        ([LABEL, {"conversation_id": "c2", "human": ["pass"]}], [VERDICT], "labels:2: human"),
        ([LABEL], [{"conversation_id": "c1", "verdict": {"x": 1}}], "verdicts:1: verdict"),
        ([LABEL], [{"conversation_id": "c1", "verdict": ["fail"]}], "verdicts:1: verdict"),
        ([LABEL], [{**VERDICT, "judge_version": {"a": 1}}], "verdicts:1: judge_version"),
        ([LABEL], [{**VERDICT, "judge_version": [1]}], "verdicts:1: judge_version"),
        ([LABEL], [{**VERDICT, "judge_version": True}], "verdicts:1: judge_version"),
    ],
)
def test_api_refuses_wrong_types_by_item_and_field(
    sqlite_url: str, labels: list[dict[str, Any]], verdicts: list[dict[str, Any]], where: str
) -> None:
    rt = build_runtime(make_settings(sqlite_url, calibration_min_labels=1), registry=CollectorRegistry())
    with make_client(rt) as client:
        body = {"labels": labels, "verdicts": verdicts, "save": True}
        r = client.post(f"/v1/judges/{JUDGE}/calibration", json=body, headers=ADMIN)
        assert r.status_code == 422, r.text
        assert where in r.json()["detail"]
    rt.close()


def test_api_still_takes_a_numeric_judge_version(sqlite_url: str) -> None:
    rt = build_runtime(make_settings(sqlite_url, calibration_min_labels=1), registry=CollectorRegistry())
    with make_client(rt) as client:
        body = {"labels": [LABEL], "verdicts": [{**VERDICT, "judge_version": 3}], "save": False}
        r = client.post(f"/v1/judges/{JUDGE}/calibration", json=body, headers=ADMIN)
        assert r.status_code == 200, r.text
        assert [v["judge_version"] for v in r.json()["versions"]] == ["3"]
    rt.close()


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("labels", "verdicts", "pairwise", "where"),
    [
        ([{"conversation_id": "c1", "human": ["fail"]}], [VERDICT], None, "l.jsonl:1: human"),
        ([LABEL], [{"conversation_id": "c1", "verdict": {"x": 1}}], None, "v.jsonl:1: verdict"),
        ([LABEL], [{**VERDICT, "judge_version": {"a": 1}}], None, "v.jsonl:1: judge_version"),
        ([LABEL], [VERDICT], [{"first_choice": ["a"], "second_choice": "a"}], "p.jsonl:1: first_choice"),
        ([LABEL], [VERDICT], [{"first_choice": "a", "second_choice": {"b": 1}}], "p.jsonl:1: second_choice"),
        ([LABEL], [VERDICT], [{"first_choice": "a", "second_choice": "a", "human": ["a"]}], "p.jsonl:1: human"),
    ],
)
def test_cli_refuses_wrong_types_with_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    labels: list[dict[str, Any]],
    verdicts: list[dict[str, Any]],
    pairwise: list[dict[str, Any]] | None,
    where: str,
) -> None:
    monkeypatch.setenv("VIGIL_DATABASE_URL", f"sqlite:///{tmp_path / 'v.db'}")
    monkeypatch.setenv("VIGIL_JUDGES_DIR", str(tmp_path / "no-judges"))
    args = ["calibrate", JUDGE, "--labels", str(_jsonl(tmp_path / "l.jsonl", labels))]
    args += ["--verdicts", str(_jsonl(tmp_path / "v.jsonl", verdicts)), "--no-save"]
    if pairwise is not None:
        args += ["--pairwise", str(_jsonl(tmp_path / "p.jsonl", pairwise))]
    r = cli_runner().invoke(app, args)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "error:" in r.output and where in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("counts", [(1, 0, 0, 1), (2, 0, 0, 1), (1, 1, 1, 1), (3, 0, 0, 3)])
def test_kappa_on_a_handful_of_labels_has_no_interval(counts: tuple[int, int, int, int]) -> None:
    k = agreement_from_counts(*counts).kappa
    assert k.value is not None and k.n == sum(counts)
    assert k.low is None and k.high is None and k.note == "n too small"
    assert k.as_dict()["note"] == "n too small"
    assert "n too small" in _est(k.as_dict(), False)


def test_fleiss_on_three_items_has_no_interval() -> None:
    k = fleiss(np.array([[1, 1], [1, 1], [1, 1]]))
    assert k.value == pytest.approx(-1.0) and k.low is None and k.high is None and k.note == "n too small"
    out = inter_rater({f"i{n}": [("ann", "fail"), ("bob", "pass"), ("cy", "fail")] for n in range(3)})
    assert out["kappa"]["low"] is None and out["kappa"]["note"] == "n too small"


def test_perfect_agreement_never_has_a_zero_width_interval() -> None:
    k = cohens_kappa(np.array([[30.0, 0.0], [0.0, 30.0]]))
    assert k.value == pytest.approx(1.0)
    assert k.low is None or k.low < k.high


def test_enough_labels_keep_their_interval() -> None:
    k = agreement_from_counts(20, 5, 4, 21).kappa
    assert k.low is not None and k.high is not None and k.low < k.value < k.high
    assert "note" not in k.as_dict()


def test_api_ui_and_cli_say_n_too_small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from fastapi.testclient import TestClient

    from vigil.app.server import build_app

    labels = [{"conversation_id": "c1", "human": "fail"}, {"conversation_id": "c2", "human": "pass"}]
    verdicts = [{"conversation_id": "c1", "verdict": "fail"}, {"conversation_id": "c2", "verdict": "pass"}]
    db = f"sqlite:///{tmp_path / 'v.db'}"
    rt = build_runtime(make_settings(db, calibration_min_labels=1, judge_mode="live"), registry=CollectorRegistry())
    with make_client(rt) as client:
        body = {"labels": labels, "verdicts": verdicts, "source": "tiny"}
        r = client.post(f"/v1/judges/{JUDGE}/calibration", json=body, headers=ADMIN)
        assert r.status_code == 200, r.text
        (v,) = r.json()["versions"]
        kappa = v["agreement"]["kappa"]
        assert kappa["value"] == pytest.approx(1.0) and kappa["low"] is None and kappa["note"] == "n too small"
    with TestClient(build_app(rt)) as ui:
        page = ui.get("/ui/login")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        ui.post("/ui/login", data={"csrf": token, "api_key": "rita-key"})
        html = ui.get("/ui/calibration").text
        assert 'id="judge-support-generic"' in html and "[n too small]" in html
    rt.close()
    monkeypatch.setenv("VIGIL_DATABASE_URL", db)
    monkeypatch.setenv("VIGIL_JUDGES_DIR", str(tmp_path / "no-judges"))
    args = ["calibrate", JUDGE, "--labels", str(_jsonl(tmp_path / "l.jsonl", labels)), "--no-save"]
    r = cli_runner().invoke(app, [*args, "--verdicts", str(_jsonl(tmp_path / "v.jsonl", verdicts))])
    assert r.exit_code in (0, 1), r.output
    assert "Cohen's kappa" in r.stdout and "1.000  [n too small]" in r.stdout


def test_api_calibration_runs_no_sql_on_the_event_loop(sqlite_url: str) -> None:
    """``POST /v1/judges/{name}/calibration`` read the labelled conversations, and saved the run, on the event
    loop: a database that waited stalled every other request of the process (probes, ingest) meanwhile."""
    import asyncio

    from sqlalchemy import event

    rt = build_runtime(make_settings(sqlite_url, calibration_min_labels=1), registry=CollectorRegistry())
    on_loop: list[str] = []

    def watch(*args: Any) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # a worker thread
        on_loop.append(" ".join(str(args[2]).split())[:80])

    with make_client(rt) as client:
        event.listen(rt.engine, "before_cursor_execute", watch)
        labels = [{"conversation_id": f"c{i}", "human": "fail" if i % 3 else "pass"} for i in range(12)]
        verdicts = [{"conversation_id": f"c{i}", "verdict": "fail" if i % 2 else "pass"} for i in range(12)]
        for body in ({"labels": labels, "verdicts": verdicts, "save": True}, {"labels": labels, "save": False}):
            r = client.post(f"/v1/judges/{JUDGE}/calibration", json=body, headers=ADMIN)
            assert r.status_code == 200, r.text
        event.remove(rt.engine, "before_cursor_execute", watch)
    rt.close()
    assert not on_loop, on_loop
