"""Calibration in other stages' answers (judges listing, compare table) and the UI pages."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import REVIEWER, make_settings, served
from tests.support.browser import ARGS, CHROMIUM, sign_in
from tests.support.judge_fakes import judge_dir
from tests.support.services import missing
from tests.support.traffic import clean, with_defect
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.schema import Conversation
from vigil.store.models import ReviewItemRow, ReviewLabelRow, VerdictRow


def _verdict(c: dict, verdict: str) -> VerdictRow:
    return VerdictRow(
        judge="tj",
        judge_version="3",
        conversation_id=c["conversation_id"],
        revision=1,
        agent_id=c["agent_id"],
        agent_version=c["agent_version"],
        verdict=verdict,
        categories=[],
        model="m",
        offline=False,
        prompt_hash="h",
        reason="sampled",
    )


def _loaded(tmp: Path):  # type: ignore[no-untyped-def]
    settings = make_settings(
        f"sqlite:///{tmp / 'v.db'}",
        judges_dir=str(judge_dir(tmp / "judges")),
        compare_bootstrap_resamples=100,
        calibration_min_labels=20,
        calibration_correction_labels="all",
        judge_mode="live",  # the seeded verdicts are the model's
    )
    rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})
    base = clean(60, "v1", 1)
    cand = clean(40, "v2", 2) + with_defect(20, "v2", "cancel_delivered", 3)
    rt.pipeline.process([Conversation.model_validate(c) for c in base + cand], "test")
    with rt.sessions.begin() as s:
        for i, c in enumerate(base + cand):
            bad = c["metadata"].get("simulated_defect") == "cancel_delivered"
            judged_fail = bad or i % 10 == 0  # catches every real failure, 10% false alarms
            s.add(_verdict(c, "fail" if judged_fail else "pass"))
            if i % 3 == 0 or bad:
                s.add(
                    ReviewLabelRow(
                        conversation_id=c["conversation_id"],
                        revision=1,
                        reviewer="rita",
                        label="confirmed_failure" if bad else "not_a_failure",
                        version=1,
                        is_current=True,
                        category="wrong_action" if bad else None,
                    )
                )
    return rt, base, cand


def _login(ui, key: str) -> None:  # type: ignore[no-untyped-def]
    page = ui.get("/ui/login")
    token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    ui.post("/ui/login", data={"csrf": token, "api_key": key})


def test_judges_listing_and_compare_carry_calibration(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app

    rt, base, cand = _loaded(tmp_path)
    with TestClient(build_app(rt)) as api:
        (info,) = api.get("/v1/judges", headers=REVIEWER).json()
        # a conversation the policy drew for a double review still open has no settled human verdict yet
        with rt.sessions() as s:
            waiting = set(
                s.scalars(
                    select(ReviewItemRow.conversation_id).where(
                        ReviewItemRow.required_reviews > 1, ReviewItemRow.status != "done"
                    )
                )
            )
        labelled = sum(
            1
            for i, c in enumerate(base + cand)
            if (i % 3 == 0 or c["metadata"].get("simulated_defect") == "cancel_delivered")
            and c["conversation_id"] not in waiting
        )
        assert waiting and labelled > 20
        assert info["name"] == "tj" and info["calibration"]["labels"] == labelled
        assert api.get("/v1/judges/tj", headers=REVIEWER).json()["calibration"] == info["calibration"]
        assert info["calibration"]["state"] == "calibrated"
        result = api.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER).json()
    row = next(r for r in result["signals"] if r["signal"] == "judge:tj")
    cal = row["calibration"]
    assert cal["state"] == "calibrated" and cal["judge_version"] == "3"
    assert cal["baseline"]["raw"]["n"] == 60 and cal["candidate"]["raw"]["n"] == 60
    assert cal["candidate"]["raw"]["count"] == 20 + sum(
        1
        for i in range(60, 120)
        if i % 10 == 0 and cand[i - 60]["metadata"].get("simulated_defect") != "cancel_delivered"
    )
    # the judge over-reports by its false alarms; the corrected rate is lower, near the true 20 of 60
    assert cal["candidate"]["corrected"]["value"] < cal["candidate"]["raw"]["value"]
    assert abs(cal["candidate"]["corrected"]["value"] - 20 / 60) < 0.05
    rt.close()


def test_compare_page_and_cli_table_show_corrected_rates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app
    from vigil.compare.api import run_compare
    from vigil.compare.commands import render

    rt, _, _ = _loaded(tmp_path)
    result = run_compare(rt, "v1", "v2")
    cal = next(r for r in result["signals"] if r["signal"] == "judge:tj")["calibration"]
    corrected = f"{100 * cal['candidate']['corrected']['value']:.1f}%"  # as the compare table shows rates
    raw = f"{100 * cal['candidate']['raw']['value']:.1f}%"
    with TestClient(build_app(rt)) as ui:
        _login(ui, "rita-key")
        html = ui.get("/ui/compare", params={"agent": "support-bot", "baseline": "v1", "candidate": "v2"}).text
        row = html[html.index('data-signal="judge:tj"') :].split("</tr>", 1)[0]
        assert 'data-calibration="calibrated"' in row
        cell = row[row.index('data-side="candidate"') :].split("</div>", 1)[0]
        assert f"raw on sample {raw}" in cell and f"<b>{corrected}</b>" in cell and "uncalibrated" not in cell
    monkeypatch.setenv("COLUMNS", "250")
    render(result)
    line = next(x for x in capsys.readouterr().out.splitlines() if "corrected, calibrated" in x)
    assert corrected in line and f"raw on sample {raw}" in line
    # a stricter threshold: the same rates, labelled uncalibrated in both places
    rt.settings.calibration_min_kappa = 0.99
    result = run_compare(rt, "v1", "v2")
    with TestClient(build_app(rt)) as ui:
        _login(ui, "rita-key")
        html = ui.get("/ui/compare", params={"agent": "support-bot", "baseline": "v1", "candidate": "v2"}).text
        row = html[html.index('data-signal="judge:tj"') :].split("</tr>", 1)[0]
        assert 'data-calibration="uncalibrated"' in row and row.count(">uncalibrated</span>") == 3
    render(result)
    assert "corrected, UNCALIBRATED" in capsys.readouterr().out
    rt.close()


def test_calibration_and_export_pages(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app

    rt, _, cand = _loaded(tmp_path)
    with TestClient(build_app(rt)) as ui:
        r = ui.get("/ui/calibration", follow_redirects=False)
        assert r.status_code == 303 and "/ui/login" in r.headers["location"]
        _login(ui, "rita-key")
        html = ui.get("/ui/calibration").text
        assert 'href="/ui/calibration"' in html and 'href="/ui/export"' in html
        assert 'id="judge-tj"' in html and 'data-state="calibrated"' in html
        assert "Raw judge failure rate" in html and "Corrected failure rate" in html and "Cohen" in html
        assert "Corrected with the judge's error rates measured on" in html
        page = ui.get("/ui/export").text
        assert "Exporting needs an admin key" in page
        token = re.search(r'name="csrf" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]
        assert ui.post("/ui/export", data={"csrf": token, "format": "native"}).status_code == 403
    with TestClient(build_app(rt)) as ui:
        _login(ui, "admin-key")
        page = ui.get("/ui/export").text
        token = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
        assert ui.post("/ui/export", data={"format": "native"}).status_code == 403  # no form token
        r = ui.post("/ui/export", data={"csrf": token, "format": "inspect"})
        assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
        rows = [orjson.loads(line) for line in r.content.splitlines()]
        assert rows and all({"id", "input", "target", "metadata"} <= set(x) for x in rows)
        run = r.headers["x-vigil-export-run"]
        page = ui.get("/ui/export").text
        assert f'data-run="{run}" data-state="pending"' in page  # listed, not yet counted as exported
        again = ui.post("/ui/export", data={"csrf": token, "format": "inspect"})
        assert len(again.content.splitlines()) == len(rows)  # a lost download is exported again
        r = ui.post(f"/ui/export/{run}/ack", data={"csrf": token}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/ui/export"
        assert f'data-run="{run}" data-state="done"' in ui.get("/ui/export").text
        after = ui.post("/ui/export", data={"csrf": token, "format": "inspect"})
        assert after.status_code == 200 and after.content == b""
        # nothing new: nothing whose download could be lost, so the run waits for no receipt
        empty = after.headers["x-vigil-export-run"]
        assert after.headers["x-vigil-export-state"] == "done"
        assert f'data-run="{empty}" data-state="done"' in ui.get("/ui/export").text
        assert ui.post("/ui/export/999999/ack", data={"csrf": token}).status_code == 404
    # uncalibrated: a stricter threshold labels every rate as such
    rt.settings.calibration_min_kappa = 0.99
    with TestClient(build_app(rt)) as ui:
        _login(ui, "rita-key")
        html = ui.get("/ui/calibration").text
        assert 'data-state="uncalibrated"' in html and html.count(">uncalibrated</span>") >= 4
    rt.close()


@pytest.mark.browser
def test_calibration_and_export_pages_in_a_browser(tmp_path: Path) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("python playwright")
    if not Path(CHROMIUM).exists():
        missing(f"Chromium at {CHROMIUM}")

    rt, _, _ = _loaded(tmp_path)
    with served(rt, close=True) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(accept_downloads=True)
        errors: list[str] = []
        page.on(
            "console",
            lambda m: errors.append(m.text) if m.type == "error" and "404" not in m.text else None,
        )
        page.on(
            "response",
            lambda r: errors.append(r.url) if r.status == 404 and "favicon" not in r.url else None,
        )
        sign_in(page, base, "/ui/calibration", "admin-key")
        section = page.locator("#judge-tj")
        assert section.locator("h2 .pill").inner_text() == "calibrated"
        assert section.locator("table.rates tbody tr").count() == 2  # v1 and v2 of support-bot
        assert "Corrected failure rate" in section.inner_text()
        assert page.locator("nav.nav a", has_text="Calibration").get_attribute("aria-current") == "page"
        page.click("nav.nav a:has-text('Export')")
        page.wait_for_url(f"{base}/ui/export")
        page.select_option("select[name=format]", "verifiers")
        with page.expect_download() as dl:
            page.click("form[action='/ui/export'] button[type=submit]")
        path = dl.value.path()
        rows = [orjson.loads(line) for line in Path(path).read_bytes().splitlines()]
        expected = {"id", "name", "prompt", "system_prompt", "tools", "criteria", "answer", "info"}
        assert rows and all(set(r) == expected for r in rows)  # verifiers TaskData rows
        page.goto(f"{base}/ui/export")
        assert page.locator("table.queue tbody tr").first.inner_text().split("\t")[2] == "verifiers"
        assert errors == []
        browser.close()


def test_without_labels_the_page_says_why_there_is_no_corrected_rate(tmp_path: Path) -> None:
    """Every rate's corrected cell said "no human labels", and the note under the table still read
    "Corrected with the judge's error rates measured on no labels"."""
    from fastapi.testclient import TestClient
    from sqlalchemy import delete

    from vigil.app.server import build_app

    rt, _, _ = _loaded(tmp_path)
    with rt.sessions.begin() as s:
        s.execute(delete(ReviewLabelRow))
    with TestClient(build_app(rt)) as ui:
        _login(ui, "rita-key")
        html = ui.get("/ui/calibration").text
        assert "Raw judge failure rate" in html and "measured on no labels" not in html
        note = re.search(r'class="muted small corrected-how">(.*?)</p>', html)
        assert note and note.group(1).startswith("No corrected rates yet")
    rt.close()
