"""Export of confirmed failures: real τ² retail conversations through the pipeline, labels in review_labels.

Covers the native schema, Inspect AI (loaded with ``inspect_ai``'s own reader), verifiers (checked against
OpenAI's chat message types), PII redaction, near-duplicate grouping and incremental export.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import ADMIN, REVIEWER, make_client, make_settings
from tests.support.services import missing, shared_data
from vigil.app.runtime import build_runtime
from vigil.export.schema import EvalTask
from vigil.ingest.importers import load_file
from vigil.rules.builtin_text import find_pii
from vigil.settings import PROJECT_ROOT
from vigil.store.models import ReviewLabelRow

RETAIL = ("tau2", "trajectories", "sierra_gpt-4.1_retail_defautl_gpt-4.1_1trials.json")
USER_ID = r"\b[a-z]+_[a-z]+_\d{4}\b"  # τ² retail user ids, e.g. mia_li_3668: a configured pattern


def _label(cid: str, label: str, reviewer: str = "rita", **kw: Any) -> ReviewLabelRow:
    return ReviewLabelRow(
        conversation_id=cid,
        revision=1,
        reviewer=reviewer,
        label=label,
        version=1,
        is_current=True,
        category=kw.pop("category", "policy_violation" if label == "confirmed_failure" else None),
        **kw,
    )


@pytest.fixture
def world(db_url: str):  # type: ignore[no-untyped-def]
    settings = make_settings(
        db_url,
        rule_packs=str(PROJECT_ROOT / "rules" / "*.yaml"),
        export_redact_patterns={"user_id": USER_ID},
    )
    rt = build_runtime(settings, registry=CollectorRegistry())
    convs = list(load_file(shared_data(*RETAIL), "auto", None, None))
    by_rule: dict[str, Any] = {}
    for c in convs:
        for f in rt.rules.evaluate(c):
            by_rule.setdefault(f.rule_id, c)
    forbidden = by_rule["retail-return-exchange-only-delivered"]
    confirm = next(
        c
        for c in convs
        if any(
            f.rule_id == "retail-confirm-before-write" and f.details.get("tool") == "cancel_pending_order"
            for f in rt.rules.evaluate(c)
        )
    )
    clean = next(
        c
        for c in convs
        if not [f for f in rt.rules.evaluate(c) if f.severity != "info"] and any("@" in m.text for m in c.messages)
    )
    twin = forbidden.model_copy(update={"conversation_id": forbidden.conversation_id + ":retry"})
    with make_client(rt) as client:
        rt.pipeline.process([*convs, twin], "test")
        ids = {
            "forbidden": forbidden.conversation_id,
            "twin": twin.conversation_id,
            "confirm": confirm.conversation_id,
            "clean": clean.conversation_id,
        }
        rest = [c.conversation_id for c in convs if c.conversation_id not in ids.values()]
        with rt.sessions.begin() as s:
            s.add(
                _label(
                    ids["forbidden"],
                    "confirmed_failure",
                    severity="high",
                    notes="Returned a pending order.",
                    expected_behavior="Explain that only delivered orders can be returned; call nothing.",
                )
            )
            s.add(_label(ids["twin"], "confirmed_failure"))
            s.add(_label(ids["confirm"], "confirmed_failure", category="unconfirmed_write"))
            s.add(
                _label(
                    ids["clean"],
                    "confirmed_failure",
                    category="unresolved",
                    notes="User called back from 415-555-0132; card 4111 1111 1111 1111 was on file.",
                    expected_behavior="Write to the user at jane.doe@example.com with the balance.",
                )
            )
            s.add(_label(rest[0], "not_a_failure"))
            s.add(_label(rest[1], "confirmed_failure"))  # outvoted by two reviewers: not confirmed
            s.add(_label(rest[1], "not_a_failure", reviewer="raj"))
            s.add(_label(rest[1], "not_a_failure", reviewer="ann"))
        yield rt, client, ids, {c.conversation_id: c for c in [*convs, twin]}, rest
    rt.close()


def _lines(body: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in body.splitlines() if line.strip()]


def _export(client: Any, ack: bool = True, **params: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """One API export; ``ack``: then acknowledge it, as a client does once the file is safely written."""
    r = client.post("/v1/exports", params=params, headers=ADMIN)
    assert r.status_code == 200, r.text
    # pending until acknowledged; a run with nothing new to record (empty, or every task exported before)
    # waits for no receipt
    state = r.headers["x-vigil-export-state"]
    if not r.content:
        assert state == "done"
    elif not params.get("all"):  # new tasks: pending until acknowledged (with all, maybe all exported before)
        assert state == "pending"
    if ack:
        a = client.post(r.headers["x-vigil-export-ack"], headers=ADMIN)
        assert a.status_code == 200 and a.json()["state"] == "done", a.text
    return _lines(r.content), dict(r.headers)


def test_native_export_schema_grading_redaction_and_dedupe(world) -> None:  # type: ignore[no-untyped-def]
    rt, client, ids, convs, _ = world
    assert client.post("/v1/exports", headers=REVIEWER).status_code == 403
    tasks, headers = _export(client)
    assert headers["x-vigil-tasks"] == "3" and headers["x-vigil-grouped"] == "1"
    from vigil.export.checks import checkable

    assert headers["x-vigil-checkable"] == str(sum(checkable(t["grading"]) for t in tasks))
    for t in tasks:
        EvalTask.model_validate(t)
    by_source = {t["source"]["conversation_id"]: t for t in tasks}
    assert set(by_source) == {ids["forbidden"], ids["confirm"], ids["clean"]}  # the twin folds into its group

    t = by_source[ids["forbidden"]]
    original = convs[ids["forbidden"]]
    assert t["duplicates"] == [ids["twin"]]
    assert t["source"]["agent_id"] == "tau2-retail" and t["source"]["agent_version"] == original.agent_version
    idx = t["failure"]["message_index"]
    failed = original.messages[idx]
    assert failed.role == "assistant"
    # the earliest high finding: the first return (beside an exchange), to a made-up gift card, on an undelivered order
    assert "return_delivered_order_items" in [c.name for c in failed.tool_calls or []]
    assert len(t["messages"]) == idx and t["messages"][-1]["role"] != "assistant"
    assert {"type": "must_not_call", "tool": "return_delivered_order_items"}.items() <= next(
        g for g in t["grading"] if g["type"] == "must_not_call"
    ).items()
    assert any(g["type"] == "rubric" and "only delivered orders" in g["text"] for g in t["grading"])
    assert t["review"]["notes"] == ["Returned a pending order."]
    assert t["failure"]["severity"] == "high"
    assert t["goal"] and t["goal"][:40] == re.sub(USER_ID, "[REDACTED:user_id]", original.metadata["goal"])[:40]

    c = by_source[ids["confirm"]]
    assert {"type": "must_confirm_before_call", "tool": "cancel_pending_order"}.items() <= next(
        g for g in c["grading"] if g["type"] == "must_confirm_before_call"
    ).items()
    assert c["failure"]["category"] == "unconfirmed_write"

    clean = by_source[ids["clean"]]
    assert clean["failure"]["located_by"] is None  # no rule fired: the agent's last turn
    last_assistant = max(i for i, m in enumerate(convs[ids["clean"]].messages) if m.role == "assistant")
    assert clean["failure"]["message_index"] == last_assistant

    # only findings at or above VIGIL_EXPORT_MIN_CRITERION_SEVERITY (medium) became hard criteria
    assert rt.settings.export_min_criterion_severity == "medium"
    below = 0
    for task in tasks:
        severity = {r["rule_id"]: r["severity"] for r in task["failure"]["rules"]}
        below += sum(s in ("info", "low") for s in severity.values())
        assert all(severity[g["rule_id"]] not in ("info", "low") for g in task["grading"] if g.get("rule_id"))
    assert below  # some findings were below the floor: reported in failure.rules, never criteria

    raw = b"".join(orjson.dumps(x) for x in tasks).decode()
    assert find_pii(raw, ["email", "phone", "card"]) == []
    assert not re.search(USER_ID, raw)
    assert "jane.doe@example.com" not in raw and "4111 1111 1111 1111" not in raw and "415-555-0132" not in raw
    for kind in ("email", "phone", "card", "user_id"):
        assert f"[REDACTED:{kind}]" in raw
    emails = {
        msg.text[f.start : f.end]
        for conv in convs.values()
        for msg in conv.messages
        for f in find_pii(msg.text, ["email"])
    }
    assert emails and not any(e in raw for e in emails)


def test_grouped_duplicates_keep_every_reviewers_notes(world) -> None:  # type: ignore[no-untyped-def]
    rt, client, ids, _, _ = world
    with rt.sessions.begin() as s:
        s.query(ReviewLabelRow).filter_by(conversation_id=ids["twin"]).update({"is_current": False})
        relabel = _label(
            ids["twin"],
            "confirmed_failure",
            notes="Same mistake on the retry.",
            expected_behavior="Offer to cancel the pending order instead.",
        )
        relabel.version = 2
        s.add(relabel)
        s.add(
            _label(
                ids["forbidden"],
                "confirmed_failure",
                reviewer="raj",
                notes="Returned a pending order.",  # the same words as rita's: kept once
                expected_behavior="Explain that only delivered orders can be returned; call nothing.",
            )
        )
    tasks, headers = _export(client)
    assert headers["x-vigil-grouped"] == "1"
    (t,) = [t for t in tasks if ids["twin"] in [t["source"]["conversation_id"], *t["duplicates"]]]
    assert {t["source"]["conversation_id"], *t["duplicates"]} == {ids["forbidden"], ids["twin"]}
    assert sorted(t["review"]["notes"]) == ["Returned a pending order.", "Same mistake on the retry."]
    expected = t["review"]["expected_behavior"]
    assert expected.count("only delivered orders") == 1 and "Offer to cancel the pending order" in expected
    rubric = [g["text"] for g in t["grading"] if g["type"] == "rubric"]
    assert rubric == [expected]
    EvalTask.model_validate(t)


def test_a_one_to_one_disagreement_is_disputed_and_not_exported(world) -> None:  # type: ignore[no-untyped-def]
    rt, client, _, _, rest = world
    with rt.sessions.begin() as s:
        s.add(_label(rest[3], "confirmed_failure", category="tone"))
        s.add(_label(rest[3], "not_a_failure", reviewer="raj"))
        s.add(_label(rest[4], "confirmed_failure", category="tone"))  # two against one: confirmed
        s.add(_label(rest[4], "confirmed_failure", reviewer="raj", category="tone"))
        s.add(_label(rest[4], "not_a_failure", reviewer="ann"))
    tasks, _ = _export(client, all="true")
    exported = {t["source"]["conversation_id"] for t in tasks} | {d for t in tasks for d in t["duplicates"]}
    assert rest[3] not in exported  # one reviewer's word against another's: disputed, as calibration has it
    assert rest[4] in exported


def test_a_label_stops_counting_once_its_conversation_has_a_newer_revision(world) -> None:  # type: ignore[no-untyped-def]
    from vigil.calibration.live import live_pairs
    from vigil.store.models import VerdictRow

    rt, client, ids, convs, _ = world
    cid = ids["confirm"]
    conv = convs[cid]
    rev = conv.effective_revision

    def verdict(revision: int, rationale: str) -> VerdictRow:
        return VerdictRow(judge="support-generic", judge_version="1", conversation_id=cid, revision=revision,
                          agent_id=conv.agent_id, agent_version=conv.agent_version, verdict="fail", categories=[],
                          rationale=rationale, model="scripted", prompt_hash="0" * 64, reason="sampled")  # fmt: skip

    with rt.sessions.begin() as s:
        s.query(ReviewLabelRow).filter_by(conversation_id=cid).update({"revision": rev})
        s.add(verdict(rev, "the first run cancelled without asking"))

    def task_of(tasks: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next((t for t in tasks if cid in [t["source"]["conversation_id"], *t["duplicates"]]), None)

    def calibrated() -> bool:
        with rt.sessions() as s:
            return cid in [p.conversation_id for p in live_pairs(s, "support-generic").get("support-generic", [])]

    assert task_of(_export(client, all="true")[0]) is not None and calibrated()
    # a newer revision is text nobody reviewed: the label given on the old one no longer confirms a failure
    rt.pipeline.process([conv.model_copy(update={"revision": rev + 1})], "test")
    assert task_of(_export(client, all="true")[0]) is None and not calibrated()
    item = client.get(f"/v1/review/items/{cid}", headers=ADMIN).json()
    assert item["state"] == "available" and item["labels"] == [] and item["review_count"] == 0
    history = client.get(f"/v1/review/items/{cid}/history", headers=ADMIN).json()
    assert [(lab["revision"], lab["is_current"]) for lab in history["labels"]] == [(rev, False)]
    assert {"revision": rev + 1, "labels_superseded": 1} in [e["detail"] for e in history["audit"]]
    # labelled again on the new revision, it is exported with that revision's verdicts only
    with rt.sessions.begin() as s:
        s.add(verdict(rev + 1, "the second run cancelled without asking too"))
    body = {"label": "confirmed_failure", "category": "missing_confirmation"}
    assert client.post(f"/v1/review/items/{cid}/labels", json=body, headers=REVIEWER).status_code == 201
    task = task_of(_export(client, all="true")[0])
    assert task is not None and task["source"]["revision"] == rev + 1
    assert [j["rationale"] for j in task["failure"]["judges"]] == ["the second run cancelled without asking too"]


def test_incremental_export_with_watermark(world) -> None:  # type: ignore[no-untyped-def]
    rt, client, ids, _, rest = world
    first, h1 = _export(client)
    assert len(first) == 3
    again, h2 = _export(client)
    assert again == [] and h2["x-vigil-watermark"] == h1["x-vigil-watermark"]
    with rt.sessions.begin() as s:
        s.add(_label(rest[2], "confirmed_failure", category="tone"))
    # a later near-duplicate of an exported failure is not exported twice
    dup = ids["forbidden"] + ":again"
    conv = orjson.loads(client.get(f"/v1/conversations/{ids['forbidden']}", headers=ADMIN).content)["conversation"]
    conv["conversation_id"] = dup
    assert client.post("/v1/conversations", json=[conv], headers=ADMIN).status_code < 300
    with rt.sessions.begin() as s:
        s.add(_label(dup, "confirmed_failure"))
    new, h3 = _export(client)
    assert [t["source"]["conversation_id"] for t in new] == [rest[2]]
    assert h3["x-vigil-grouped"] == "1" and int(h3["x-vigil-watermark"]) > int(h1["x-vigil-watermark"])
    since, _ = _export(client, since=h1["x-vigil-watermark"], all="true")
    assert {t["source"]["conversation_id"] for t in since} == {rest[2], dup}  # dup: its own group when alone
    everything, _ = _export(client, all="true")
    assert len(everything) == 4
    # another format keeps its own record
    assert len(_export(client, format="inspect")[0]) == 4
    runs = client.get("/v1/exports", headers=ADMIN).json()
    assert [r["tasks"] for r in runs][:3] == [4, 4, 2]
    # times carry their offset on every database (SQLite's came back as a bare wall time)
    for run in runs:
        for key in ("created_at", "acknowledged_at"):
            assert run[key] is None or datetime.fromisoformat(run[key].replace("Z", "+00:00")).utcoffset() is not None
    r = client.post("/v1/exports", params={"format": "csv"}, headers=ADMIN)
    assert r.status_code == 422
    # options sent as a JSON body were ignored: a native export came back, and a run was recorded
    r = client.post("/v1/exports", json={"format": "inspect"}, headers=ADMIN)
    assert r.status_code == 422 and "query parameters" in r.json()["detail"]
    assert client.get("/v1/exports", headers=ADMIN).json() == runs


def test_unacknowledged_api_export_is_exported_again(world) -> None:  # type: ignore[no-untyped-def]
    rt, client, ids, _, _ = world
    lost, h1 = _export(client, ack=False)  # the download never reached the client
    assert len(lost) == 3
    runs = client.get("/v1/exports", headers=ADMIN).json()
    assert runs[0]["run_id"] == int(h1["x-vigil-export-run"]) and runs[0]["state"] == "pending"
    # reviewers list runs (as /ui/export shows them to them), but neither run nor acknowledge one
    assert client.get("/v1/exports", headers=REVIEWER).json() == runs
    assert client.post("/v1/exports", headers=REVIEWER).status_code == 403
    assert client.get("/v1/exports").status_code == 401
    again, h2 = _export(client, ack=False)
    assert sorted(t["task_id"] for t in again) == sorted(t["task_id"] for t in lost)
    # acknowledging the second run records its tasks; the first one's late ack changes nothing
    assert client.post(h2["x-vigil-export-ack"], headers=REVIEWER).status_code == 403
    done = client.post(h2["x-vigil-export-ack"], headers=ADMIN).json()
    assert done["state"] == "done" and done["acknowledged_at"] and done["tasks"] == 3
    assert client.post(h2["x-vigil-export-ack"], headers=ADMIN).json()["state"] == "done"  # idempotent
    assert client.post(h1["x-vigil-export-ack"], headers=ADMIN).status_code == 200
    assert _export(client)[0] == []
    assert client.post("/v1/exports/999999/ack", headers=ADMIN).status_code == 404
    from vigil.export.models import ExportedTaskRow

    with rt.sessions() as s:
        recorded = {(r.conversation_id, r.run_id) for r in s.query(ExportedTaskRow)}
    assert {cid for cid, _ in recorded} == {ids["forbidden"], ids["twin"], ids["confirm"], ids["clean"]}
    assert {run for _, run in recorded} == {int(h2["x-vigil-export-run"])}


def test_inspect_round_trip(world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    try:
        import inspect_ai.dataset as dataset_mod
    except ImportError:
        missing("inspect_ai (pip install -e '.[dev]')")
    _, client, ids, convs, _ = world
    native, _ = _export(client)
    body, _ = _export(client, format="inspect")
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in body))
    samples = list(dataset_mod.json_dataset(str(path)))
    assert len(samples) == len(native) == 3
    by_id = {t["task_id"]: t for t in native}
    for sample in samples:
        t = by_id[sample.id]
        assert sample.metadata["source"] == t["source"] and sample.metadata["grading"] == t["grading"]
        assert [m.role for m in sample.input] == [m["role"] for m in t["messages"]]
        calls = [c.function for m in sample.input if m.role == "assistant" for c in (m.tool_calls or [])]
        assert calls == [c["function"]["name"] for m in t["messages"] for c in m.get("tool_calls") or []]
        results = [m for m in sample.input if m.role == "tool"]
        assert all(m.function for m in results)
        assert sample.target == (t["review"]["expected_behavior"] or sample.target)
    forbidden = by_id[next(k for k, t in by_id.items() if t["source"]["conversation_id"] == ids["forbidden"])]
    s = next(x for x in samples if x.id == forbidden["task_id"])
    assert s.target.startswith("Explain that only delivered orders can be returned")


def test_verifiers_rows_are_verifiers_task_data(world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Rows in the fields of the current verifiers release's TaskData, loaded by verifiers' own taskset loader."""
    from pydantic import TypeAdapter
    from verifiers.v1.types import Messages
    from verifiers.v1.utils.loaders import taskset_class

    from vigil.export.harness.verifiers_env import VigilConfig

    _, client, ids, _, _ = world
    rows, _ = _export(client, format="verifiers")
    native, _ = _export(client, all="true")
    assert len(rows) == 3
    by_task = {t["task_id"]: t for t in native}
    for row in rows:
        assert set(row) == {"id", "name", "prompt", "system_prompt", "tools", "criteria", "answer", "info"}
        TypeAdapter(Messages).validate_python(row["prompt"])  # verifiers' own message types (flat tool calls)
        task = by_task[row["id"]]
        assert len(row["prompt"]) + (1 if row["system_prompt"] else 0) == len(task["messages"])
        assert row["criteria"] == task["grading"] and row["tools"] == task["tools"] and row["answer"]
        assert row["info"]["schema"] == "vigil.eval_task"
    path = tmp_path / "failures.verifiers.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    taskset = taskset_class("vigil_verifiers")(VigilConfig(id="vigil_verifiers", path=str(path)))
    tasks = list(taskset)
    assert [t.data.id for t in tasks] == [r["id"] for r in rows]
    forbidden = next(t for t in tasks if t.data.info["source"]["conversation_id"] == ids["forbidden"])
    assert {"return_delivered_order_items"} <= {t["function"]["name"] for t in forbidden.data.tools}


def test_cli_export_writes_file_and_rejects_bad_input(world, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tests.support.cli import cli_runner
    from vigil.app.cli import app

    rt, _, _, _, _ = world
    monkeypatch.setenv("VIGIL_DATABASE_URL", rt.settings.database_url_str)
    monkeypatch.setenv("VIGIL_RULE_PACKS", rt.settings.rule_packs)
    monkeypatch.setenv("VIGIL_EXPORT_REDACT_PATTERNS", '{"user_id": "' + USER_ID.replace("\\", "\\\\") + '"}')
    out = tmp_path / "tasks.jsonl"
    r = cli_runner().invoke(app, ["export", "--format", "native", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert len(_lines(out.read_bytes())) == 3 and "watermark" in r.output
    # a task no harness can fail is said, not passed off as a regression test
    from vigil.export.checks import checkable

    unchecked = sum(not checkable(t["grading"]) for t in _lines(out.read_bytes()))
    said = f"{unchecked} of 3 tasks have no criterion the harnesses check" in " ".join(r.output.split())
    assert said == (unchecked > 0), r.output
    r = cli_runner().invoke(app, ["export", "--out", str(out)])
    assert r.exit_code == 0 and _lines(out.read_bytes()) == []
    r = cli_runner().invoke(app, ["export", "--format", "yaml"])
    assert r.exit_code == 2 and "format must be one of" in r.output
    r = cli_runner().invoke(app, ["export", "--since", "99999999999999999999999"])  # an OverflowError before
    assert r.exit_code == 2 and "Traceback" not in r.output
    # a link is written through, not replaced (--out /dev/stdout as root replaced the device's link)
    target, link = tmp_path / "target.jsonl", tmp_path / "link.jsonl"
    target.write_bytes(b"")
    link.symlink_to(target)
    r = cli_runner().invoke(app, ["export", "--all", "--out", str(link)])
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and len(_lines(target.read_bytes())) == 3
    # a directory is refused, and nothing is left beside it
    r = cli_runner().invoke(app, ["export", "--all", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "is a directory" in r.output
    assert not list(tmp_path.parent.glob(f"{tmp_path.name}.partial"))
    # a pipe (or a device) is written to directly
    import os
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    r = cli_runner().invoke(app, ["export", "--all", "--out", str(fifo)])
    reader.join(30)
    assert r.exit_code == 0 and len(_lines(got[0])) == 3 and fifo.is_fifo()
    monkeypatch.setenv("VIGIL_EXPORT_REDACT_PATTERNS", '{"bad": "("}')
    r = cli_runner().invoke(app, ["export"])
    assert r.exit_code == 2 and "invalid regex" in r.output


def test_concurrent_exports_never_export_a_conversation_twice(world) -> None:  # type: ignore[no-untyped-def]
    """Recording runs (the CLI's) racing: each task goes out once, whoever got there first."""
    import threading

    from sqlalchemy.exc import IntegrityError

    from vigil.export.redact import Redactor
    from vigil.export.run import export

    rt, client, _, _, _ = world
    results: list[int] = []
    gate = threading.Barrier(3)

    def run() -> None:
        gate.wait()
        try:
            with rt.sessions.begin() as s:
                result = export(s, {r.id: r for r in rt.rules.rules}, Redactor({}), actor="cli")
            results.append(result.tasks)
        except IntegrityError:
            results.append(0)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 3 and sum(results) == 3, results
    assert _export(client)[0] == []


def test_export_ack_migration_matches_the_model(db_url: str) -> None:
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import inspect

    from vigil.app.wiring import metadata
    from vigil.store import db

    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), metadata())
        assert [d for d in diffs if "export_runs" in repr(d)] == []
        cfg = db.alembic_config(engine.url.render_as_string(hide_password=False))
        command.downgrade(cfg, "0006")
        assert "state" not in {c["name"] for c in inspect(engine).get_columns("export_runs")}
        command.upgrade(cfg, "head")
        assert {"state", "records", "acknowledged_at"} <= {
            c["name"] for c in inspect(engine).get_columns("export_runs")
        }
    finally:
        engine.dispose()


def test_a_newer_revision_confirmed_again_is_exported_again_under_its_own_task_id(world) -> None:  # type: ignore[no-untyped-def]
    from vigil.export.models import ExportedTaskRow

    rt, client, ids, convs, _ = world
    cid = ids["confirm"]
    conv = convs[cid]
    rev = conv.effective_revision
    with rt.sessions.begin() as s:
        s.query(ReviewLabelRow).filter_by(conversation_id=cid).update({"revision": rev})

    def task_of(tasks: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next((t for t in tasks if cid in [t["source"]["conversation_id"], *t["duplicates"]]), None)

    first, _ = _export(client)
    old = task_of(first)
    assert old is not None and old["source"]["revision"] == rev
    others = {t["task_id"] for t in first} - {old["task_id"]}
    rt.pipeline.process([conv.model_copy(update={"revision": rev + 1})], "test")
    assert _export(client)[0] == []  # the label on the old revision no longer confirms anything
    body = {"label": "confirmed_failure", "category": "missing_confirmation"}
    assert client.post(f"/v1/review/items/{cid}/labels", json=body, headers=REVIEWER).status_code == 201
    lost, _ = _export(client, ack=False)  # a pending run of it is exported again, under the same id
    (new,) = _export(client)[0]
    assert [t["task_id"] for t in lost] == [new["task_id"]]
    assert new["source"]["conversation_id"] == cid and new["source"]["revision"] == rev + 1
    # the same failure (rule, tool, intent) on the new revision: its id says which revision replaced the task
    assert new["group_key"] == old["group_key"] and new["task_id"] == f"{old['task_id']}-r{rev + 1}"
    assert _export(client)[0] == []
    everything, _ = _export(client, all="true")  # the same ids again; the other tasks keep theirs
    assert task_of(everything) == new and {t["task_id"] for t in everything} == others | {new["task_id"]}
    (sample,) = [x for x in _export(client, format="inspect")[0] if x["metadata"]["source"]["conversation_id"] == cid]
    assert sample["id"] == new["task_id"]  # a format that never exported the old revision names it alike
    with rt.sessions() as s:
        recorded = s.query(ExportedTaskRow).filter_by(format="native", conversation_id=cid)
        assert sorted((r.revision, r.task_id) for r in recorded) == [
            (rev, old["task_id"]),
            (rev + 1, new["task_id"]),
        ]


def test_exported_task_revision_migration(db_url: str) -> None:
    import sqlalchemy as sa
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy.dialects import postgresql

    from vigil.app.wiring import metadata
    from vigil.store import db

    records = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    runs = sa.table("export_runs", sa.column("id"), sa.column("state"), sa.column("records", records))
    db.upgrade(db_url, "0015_dead_letter_last_offset")
    engine = db.make_engine(db_url)
    cfg = db.alembic_config(engine.url.render_as_string(hide_password=False))
    try:
        with engine.begin() as conn:  # exported, and pending, before revisions were recorded
            conn.execute(
                sa.text(
                    "INSERT INTO conversations (conversation_id, revision, schema_version, agent_id, agent_version, "
                    "received_at, message_count, tool_call_count, tool_error_count, finding_count, document) "
                    "VALUES ('c1', 3, 1, 'a', 'v1', CURRENT_TIMESTAMP, 1, 0, 0, 0, '{}')"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO export_runs (id, format, watermark, tasks, grouped, actor, created_at, state) "
                    "VALUES (1, 'native', 1, 1, 0, 'cli', CURRENT_TIMESTAMP, 'done'), "
                    "(2, 'inspect', 1, 1, 0, 'api', CURRENT_TIMESTAMP, 'pending')"
                )
            )
            conn.execute(sa.update(runs).where(runs.c.id == 2).values(records=[["c1", "vigil-a", "k", True]]))
            # the runs (watermark 1) saw the label on revision 2; revision 3 was confirmed after them: it was
            # never exported, and the revision stored now (3) would have marked it exported for good
            conn.execute(
                sa.text(
                    "INSERT INTO review_labels (id, conversation_id, revision, reviewer, label, category, notes, "
                    "expected_behavior, version, is_current, created_at) VALUES "
                    "(1, 'c1', 2, 'rita', 'confirmed_failure', 'wrong_action', '', '', 1, false, CURRENT_TIMESTAMP), "
                    "(2, 'c1', 3, 'rita', 'confirmed_failure', 'wrong_action', '', '', 2, true, CURRENT_TIMESTAMP)"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO exported_tasks (format, conversation_id, task_id, group_key, run_id, emitted, "
                    "created_at) VALUES ('native', 'c1', 'vigil-a', 'k', 1, true, CURRENT_TIMESTAMP)"
                )
            )
        db.upgrade(db_url)
        with engine.begin() as conn:
            assert conn.execute(sa.text("SELECT revision FROM exported_tasks")).scalars().all() == [2]
            assert conn.execute(sa.select(runs.c.records).where(runs.c.id == 2)).scalar() == [
                ["c1", "vigil-a", "k", True, 2]
            ]
            conn.execute(
                sa.text(
                    "INSERT INTO exported_tasks (format, conversation_id, revision, task_id, group_key, run_id, "
                    "emitted, created_at) VALUES ('native', 'c1', 4, 'vigil-a-r4', 'k', 1, true, CURRENT_TIMESTAMP)"
                )
            )
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), metadata())
        assert [d for d in diffs if "exported_tasks" in repr(d)] == []
        command.downgrade(cfg, "0015_dead_letter_last_offset")
        with engine.connect() as conn:  # one row per format and conversation again: the newest revision's
            assert conn.execute(sa.text("SELECT task_id FROM exported_tasks")).scalars().all() == ["vigil-a-r4"]
            assert conn.execute(sa.select(runs.c.records).where(runs.c.id == 2)).scalar() == [
                ["c1", "vigil-a", "k", True]
            ]
        command.upgrade(cfg, "head")
    finally:
        engine.dispose()


TELECOM = (
    "tau2",
    "trajectories",
    "sierra_testrun1_gpt-4.1-2025-04-14_telecom_no-user_gpt-4.1-2025-04-14_4trials_5tasks.json",
)
TELECOM_ALL = ("tau2", "trajectories", "sierra_gpt-4.1_telecom_default_gpt-4.1_1trials.json")


def test_runs_of_different_tasks_are_never_folded_into_one(sqlite_url: str) -> None:
    """τ² telecom tasks share a handful of reasons for calling ("You mobile data is not working properly...")
    and differ in the fault behind them. Grouped by the user's words alone, 18 confirmed failures of 6
    different tasks became one task and 11 of 11 tasks another: ten regression tests lost for one kept.
    A conversation's task id now keeps its task apart; the trials of one task still fold."""
    settings = make_settings(sqlite_url, rule_packs=str(PROJECT_ROOT / "rules" / "*.yaml"))
    rt = build_runtime(settings, registry=CollectorRegistry())
    convs = [c for part in (TELECOM, TELECOM_ALL) for c in load_file(shared_data(*part), "auto", None, None)]
    task_of = {c.conversation_id: c.task_id for c in convs}
    with make_client(rt) as client:
        rt.pipeline.process(convs, "test")
        with rt.sessions.begin() as s:
            s.add_all(_label(c.conversation_id, "confirmed_failure") for c in convs)
        tasks, _ = _export(client)
    rt.close()
    groups = [[t["source"]["conversation_id"], *t["duplicates"]] for t in tasks]
    assert sum(len(g) for g in groups) == len(convs)
    assert all(len({task_of[cid] for cid in g}) == 1 for g in groups), [
        sorted({task_of[cid] for cid in g}) for g in groups if len({task_of[cid] for cid in g}) > 1
    ][:2]
    assert any(len(g) > 1 for g in groups)  # trials of one task failing alike are still one task


def test_a_label_saved_while_an_export_reads_is_exported_with_it_next_time(world, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An export read the current labels twice: once for the reviewers' words, once to decide what is
    confirmed. A label saved between the two reads (READ COMMITTED: each read sees what is committed) made
    the conversation confirmed with none of its confirming labels at hand: its task left without the
    reviewer's expected behaviour (no rubric), recorded as exported, never exported again with it. One
    read now decides both: the label counts from the next run, with its words."""
    from vigil.store import reads

    rt, client, _, _, rest = world
    cid = rest[0]  # labelled not_a_failure
    real = reads.current_labels
    calls = []

    def reads_then_a_reviewer_saves(session: Any, ids: list[str] | None = None) -> Any:
        out = real(session, ids)
        if not calls:
            calls.append(1)
            with rt.sessions.begin() as s:
                s.query(ReviewLabelRow).filter_by(conversation_id=cid).update({"is_current": False})
                relabel = _label(cid, "confirmed_failure", expected_behavior="Ask before cancelling anything.")
                relabel.version = 2
                s.add(relabel)
        return out

    monkeypatch.setattr(reads, "current_labels", reads_then_a_reviewer_saves)
    first, _ = _export(client)
    monkeypatch.setattr(reads, "current_labels", real)
    second, _ = _export(client)
    [task] = [t for t in first + second if cid in [t["source"]["conversation_id"], *t["duplicates"]]]
    assert task["review"]["expected_behavior"] == "Ask before cancelling anything."
    assert {"type": "rubric", "text": "Ask before cancelling anything."} in task["grading"]


def test_a_revision_stored_while_an_export_reads_is_not_exported_as_confirmed(world, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The labels confirm one revision; the document is read after them. A newer revision stored in between
    (its ingest supersedes the labels) was exported as the confirmed failure, text nobody reviewed, and
    recorded as exported at that revision, so the reviewers' verdict on it could change nothing. The
    export now leaves a conversation whose stored revision is newer than its labels' to the next run."""
    from vigil.store import reads

    rt, client, ids, convs, _ = world
    cid = ids["confirm"]
    conv = convs[cid]
    rev = conv.effective_revision
    with rt.sessions.begin() as s:
        s.query(ReviewLabelRow).filter_by(conversation_id=cid).update({"revision": rev})
    real = reads.current_labels
    calls = []

    def reads_then_a_revision_arrives(session: Any, ids: list[str] | None = None) -> Any:
        out = real(session, ids)
        if not calls:
            calls.append(1)
            rt.pipeline.process([conv.model_copy(update={"revision": rev + 1})], "test")
        return out

    monkeypatch.setattr(reads, "current_labels", reads_then_a_revision_arrives)
    tasks, headers = _export(client)
    assert calls and headers["x-vigil-skipped"] == "1"  # said, not dropped without a word
    assert all(cid not in [t["source"]["conversation_id"], *t["duplicates"]] for t in tasks)
    # confirmed on the new revision, it is exported at that revision
    monkeypatch.setattr(reads, "current_labels", real)
    body = {"label": "confirmed_failure", "category": "missing_confirmation", "revision": rev + 1}
    assert client.post(f"/v1/review/items/{cid}/labels", json=body, headers=REVIEWER).status_code == 201
    tasks, _ = _export(client)
    [task] = [t for t in tasks if cid in [t["source"]["conversation_id"], *t["duplicates"]]]
    assert task["source"]["revision"] == rev + 1


def test_each_redacted_value_is_counted_once() -> None:
    """A task's messages and failure were redacted twice (once with the whole task, once keeping their ids),
    the failed turn three times: vigil_export_redactions_total counted one email in a message as two and one
    phone number in the failing turn as three. Each is now redacted, and counted, once."""
    from vigil.export.redact import Redactor, redact_task

    redactor = Redactor()
    task = {
        "goal": "Reach the user at 415-555-0199.",
        "messages": [{"role": "user", "content": "mail jane@example.com"}],
        "failure": {
            "message_index": 1,
            "failed_turn": {"role": "assistant", "content": "call 415-555-0132"},
            "rules": [{"rule_id": "r", "message": "leaked 4111 1111 1111 1111"}],
            "judges": [],
        },
    }
    out = redact_task(redactor, task)
    assert redactor.counts == {"email": 1, "phone": 2, "card": 1}
    assert out["messages"][0]["content"] == "mail [REDACTED:email]"
    assert out["failure"]["failed_turn"]["content"] == "call [REDACTED:phone]"
    assert out["failure"]["rules"] == [{"rule_id": "r", "message": "leaked [REDACTED:card]"}]
    assert out["goal"] == "Reach the user at [REDACTED:phone]."
    assert redact_task(redactor, {"failure": "from jane@example.com"})["failure"] == "from [REDACTED:email]"
