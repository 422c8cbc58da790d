"""Compare reads the rollups as they are and counts what was written since the rollup job's last run
itself: a request never runs the job nor writes, and its figures equal a direct count of the tables, up
to a bounded tail (SQLite and Postgres)."""

from __future__ import annotations

import copy
import re
from collections import defaultdict
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry

from tests.compare.test_compare_api import verdict_row
from tests.support.app import INGEST, REVIEWER, make_client, make_settings
from tests.support.traffic import clean, with_defect
from vigil.app.runtime import build_runtime
from vigil.store import rollup_job, rollup_tail, rollups
from vigil.store.db import aware
from vigil.store.rollups import RollupStateRow

PAIR = {"agent": "support-bot", "baseline": "v1", "candidate": "v2"}


def _runtime(url: str, **overrides: Any) -> Any:
    settings = make_settings(url, compare_bootstrap_resamples=200, compare_outcome_settle_hours=0, **overrides)
    return build_runtime(settings, registry=CollectorRegistry())


def _stored(rt: Any) -> tuple[Any, ...]:
    """The rollups and their state, as the job left them."""
    with rt.sessions() as s:
        state = s.get(RollupStateRow, rollup_job.STATE)
        return aware(state.watermark), aware(state.updated_at), rollup_job.snapshot(s)


def _direct(rt: Any, version: str) -> dict[str, tuple[int, int]]:
    """Every signal of the version counted straight from the tables."""
    out: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
    with rt.sessions() as s:
        counts, _tasks = rollup_job.from_scratch(s)
    for (_h, a, v, signal), (_f, n, x) in counts.items():
        if (a, v) == ("support-bot", version):
            out[signal] = (out[signal][0] + n, out[signal][1] + x)
    return out


def _direct_tasks(rt: Any, version: str) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
    with rt.sessions() as s:
        _counts, tasks = rollup_job.from_scratch(s)
    for (a, v, task, _day), (n, ok) in tasks.items():
        if (a, v) == ("support-bot", version) and n:
            out[task] = (out[task][0] + n, out[task][1] + ok)
    return dict(out)


def _logged_in(c: Any) -> Any:
    page = c.get("/ui/login")
    token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    c.post("/ui/login", data={"csrf": token, "api_key": "rita-key", "next": "/ui/compare"})
    return c


def _figures(body: dict[str, Any], side: str) -> dict[str, Any]:
    rows = {s["signal"]: s for s in body["signals"]}
    return {
        "conversations": body[side]["conversations"],
        "forbidden": rows["forbidden_tool"][side]["x"],
        "rule": rows["rule:no-cancel-delivered-order"][side]["x"],
        "judge": (rows["judge:helpful"][side]["n"], rows["judge:helpful"][side]["x"]),
        "escalations": rows["outcome:escalation"][side]["x"],
    }


def _expected(rt: Any, version: str) -> dict[str, Any]:
    d = _direct(rt, version)
    return {
        "conversations": d["conversations"][0],
        "forbidden": d["forbidden_tool"][1],
        "rule": d["rule:no-cancel-delivered-order"][1],
        "judge": d["judge:helpful"],
        "escalations": d["outcome:escalation"][1],
    }


def _first_traffic(c: Any, rt: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    v1 = clean(40, "v1", 1)
    v2 = clean(30, "v2", 2) + with_defect(10, "v2", "cancel_delivered", 3)
    assert c.post("/v1/conversations", json=v1 + v2, headers=INGEST).status_code == 202
    esc = [
        {"conversation_id": x["conversation_id"], "type": "escalation", "idempotency_key": f"a{i}"}
        for i, x in enumerate(v2[:2])
    ]
    assert c.post("/v1/outcomes", json=esc, headers=INGEST).status_code in (200, 202)
    with rt.sessions.begin() as s:
        s.add_all([verdict_row(x["conversation_id"], "v2", "fail") for x in v2[:5]])
    assert rollup_job.refresh(rt.sessions, lag_seconds=0).rebuilt
    return v1, v2


def test_a_read_while_the_rollups_are_behind_writes_nothing_and_counts_exactly(db_url) -> None:
    rt = _runtime(db_url)
    with make_client(rt) as c:
        v1, v2 = _first_traffic(c, rt)
        # after the job's run: new conversations, a revision with a defect (its hour and findings change),
        # outcomes for conversations counted before, and verdicts
        again = []
        for i, x in enumerate(v1[:3]):
            y = with_defect(1, "v1", "cancel_delivered", 100 + i)[0]
            y.update(conversation_id=x["conversation_id"], revision=2)
            again.append(y)
        fresh = with_defect(8, "v2", "cancel_delivered", 4) + clean(5, "v1", 5)
        assert c.post("/v1/conversations", json=again + copy.deepcopy(fresh), headers=INGEST).status_code == 202
        esc = [
            {"conversation_id": x["conversation_id"], "type": "escalation", "idempotency_key": f"e{i}"}
            for i, x in enumerate(v2[10:16] + fresh[:2])
        ] + [
            {
                "conversation_id": x["conversation_id"],
                "type": "task_success",
                "value": i % 2,
                "idempotency_key": f"t{i}",
            }
            for i, x in enumerate(v1[:20] + v2[:20] + fresh)
        ]
        assert c.post("/v1/outcomes", json=esc, headers=INGEST).status_code in (200, 202)
        with rt.sessions.begin() as s:
            s.add_all([verdict_row(x["conversation_id"], "v1", "fail") for x in v1[10:13]])
            s.add_all([verdict_row(x["conversation_id"], "v2", "pass") for x in fresh[:4]])
        before = _stored(rt)
        rollups_alone = _expected(rt, "v2")["conversations"] - 8  # what the rollups count of v2

        body = c.get("/v1/compare", params=PAIR, headers=REVIEWER).json()
        page = _logged_in(c).get("/ui/compare", params=PAIR)
        quality = c.get("/v1/quality", params={"agent": "support-bot", "version": "v2"}, headers=REVIEWER).json()

        # the request neither ran the job nor wrote: the rollups and their watermark are as they were
        assert _stored(rt) == before
        # and yet every figure is the tables' own, rows written after the watermark included
        v1_expected, v2_expected = _expected(rt, "v1"), _expected(rt, "v2")
        assert v2_expected["conversations"] == 48 != rollups_alone and v1_expected["conversations"] == 45
        assert _figures(body, "baseline") == v1_expected
        assert _figures(body, "candidate") == v2_expected
        assert v1_expected["rule"] == 3 and v2_expected["escalations"] == 10 and v2_expected["judge"] == (9, 5)
        assert body["counts"]["current"] and body["counts"]["tail_rows"] > 0
        assert quality["conversations"] == 48 and quality["counts"]["current"]
        assert page.status_code == 200 and f"({v2_expected['conversations']} conversations)" in page.text
        assert 'id="counts-up-to" data-current="true">Counts up to ' in page.text
        # every signal and pass^k's trials, as the compare's reads see them, against the tables
        with rt.sessions() as s:
            rollup_tail.attach(s, 10_000)
            for version in ("v1", "v2"):
                d = _direct(rt, version)
                got = rollups.version_counts(s, "support-bot", version)
                assert got.conversations == d["conversations"][0] and got.tool_error == d["tool_error"][1]
                assert got.rules == {k[5:]: x for k, (_n, x) in d.items() if k.startswith("rule:")}
                assert got.outcomes == {k[8:]: x for k, (_n, x) in d.items() if k.startswith("outcome:")}
                assert got.judges == {k[6:]: nx for k, nx in d.items() if k.startswith("judge:")}
                tasks = rollups.task_counts(s, "support-bot", version, min_trials=1)
                assert tasks and tasks == _direct_tasks(rt, version)
        assert _stored(rt) == before
    rt.close()


def test_a_tail_past_its_bound_is_not_read_and_the_page_says_up_to_when(db_url) -> None:
    rt = _runtime(db_url, rollup_read_tail_rows=5)
    with make_client(rt) as c:
        _first_traffic(c, rt)
        watermark = _stored(rt)[0]
        fresh = with_defect(8, "v2", "cancel_delivered", 4)
        assert c.post("/v1/conversations", json=fresh, headers=INGEST).status_code == 202

        body = c.get("/v1/compare", params=PAIR, headers=REVIEWER).json()
        page = _logged_in(c).get("/ui/compare", params=PAIR)

        # eight rows after the watermark, more than five: the rollups alone, exact up to their watermark
        assert body["candidate"]["conversations"] == 40 and _figures(body, "candidate")["forbidden"] == 10
        assert body["counts"]["current"] is False
        assert body["counts"]["counts_up_to"] == body["counts"]["rollups_watermark"]
        assert aware(_parse(body["counts"]["counts_up_to"])) == watermark
        assert 'data-current="false">Counts up to ' in page.text and "when the rollup job last ran" in page.text
        assert _stored(rt)[0] == watermark

        # once the job has run, the same read counts them
        rollup_job.refresh(rt.sessions, lag_seconds=0)
        again = c.get("/v1/compare", params=PAIR, headers=REVIEWER).json()
        assert again["candidate"]["conversations"] == 48 and again["counts"]["current"]
    rt.close()


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_no_tail_at_all_reads_the_rollups_alone(sqlite_url) -> None:
    rt = _runtime(sqlite_url, rollup_read_tail_rows=0)
    with make_client(rt) as c:
        _first_traffic(c, rt)
        assert c.post("/v1/conversations", json=clean(3, "v2", 9), headers=INGEST).status_code == 202
        body = c.get("/v1/compare", params=PAIR, headers=REVIEWER).json()
        assert body["candidate"]["conversations"] == 40 and not body["counts"]["current"]
    rt.close()


def test_a_read_with_a_tail_wakes_the_in_process_job_and_does_not_wait_for_it(sqlite_url) -> None:
    """Where the rollup job runs in the process (serve), a read that counted a tail has it run now rather than
    at the next interval (an hour here), so the next read's tail is short; the read itself runs nothing."""
    import threading

    from vigil.compare.api import counting
    from vigil.store.maintenance import Maintenance

    rt = _runtime(sqlite_url, rollup_interval_seconds=3600)
    with make_client(rt) as c:
        _first_traffic(c, rt)
        runs: list[int] = []
        ran = threading.Condition()
        job = Maintenance(rt.settings, rt.sessions)

        def run() -> None:
            rollup_job.refresh(rt.sessions, lag_seconds=0)
            with ran:
                runs.append(1)
                ran.notify_all()

        job.jobs = [("rollups", run)]
        rt.provide(job)
        stop = threading.Event()
        worker = job.thread(stop)
        try:
            with ran:
                assert ran.wait_for(lambda: len(runs) == 1, timeout=60)
            assert c.post("/v1/conversations", json=clean(3, "v2", 9), headers=INGEST).status_code == 202
            with counting(rt) as (_s, tail):
                assert tail.rows == 3 and tail.current  # counted by the read, which wakes the job
            with ran:
                assert ran.wait_for(lambda: len(runs) == 2, timeout=60)
            with counting(rt) as (_s, tail):
                assert tail.rows == 0 and tail.current
        finally:
            stop.set()
            worker.join()
    rt.close()


def _task_successes(convs: list[dict[str, Any]], tag: str, value: int = 1) -> list[dict[str, Any]]:
    return [
        {"conversation_id": x["conversation_id"], "type": "task_success", "value": (i + value) % 2,
         "idempotency_key": f"{tag}{i}"}
        for i, x in enumerate(convs)
    ]  # fmt: skip


def _tail_read(rt: Any) -> tuple[int, dict[str, tuple[int, int]], dict[str, int]]:
    """pass^k's trials and the outcome counts as a read counts them with a tail, and the SQLite virtual
    machine's steps that took (in hundreds: a measure of the rows it read, not a time)."""
    with rt.sessions() as s:
        rollup_tail.attach(s, 10_000)
        raw = s.connection().connection.driver_connection
        steps = [0]

        def step() -> int:
            steps[0] += 1
            return 0

        raw.set_progress_handler(step, 100)
        try:
            tasks = rollups.task_counts(s, "support-bot", "v1", min_trials=1)
            outcomes = rollups.version_counts(s, "support-bot", "v1").outcomes
        finally:
            raw.set_progress_handler(None, 0)
    return steps[0], tasks, outcomes


def _direct_outcomes(rt: Any) -> dict[str, int]:
    return {k[8:]: x for k, (_n, x) in _direct(rt, "v1").items() if k.startswith("outcome:")}


def _a_tail(c: Any, convs: list[dict[str, Any]], seed: int) -> None:
    """Two new conversations with outcomes, and outcomes for three conversations the job counted already
    (one a second outcome that turns a failure into a success)."""
    new = clean(2, "v1", seed)
    assert c.post("/v1/conversations", json=new, headers=INGEST).status_code == 202
    later = _task_successes(new + convs[-3:-1], f"n{seed}-") + _task_successes(convs[-1:], f"m{seed}-", value=0)
    assert c.post("/v1/outcomes", json=later, headers=INGEST).status_code in (200, 202)


def test_the_tail_reads_the_conversations_it_touched_not_their_tasks_or_hours(sqlite_url) -> None:
    """pass^k and outcome counts with a tail count exactly, and what the read looks at does not grow with
    the stored rows: the same tail over eight times the conversations of the same tasks and hour reads
    about as much."""
    rt = _runtime(sqlite_url)
    with make_client(rt) as c:
        first = clean(60, "v1", 1)
        assert c.post("/v1/conversations", json=first, headers=INGEST).status_code == 202
        assert c.post("/v1/outcomes", json=_task_successes(first[:40], "a"), headers=INGEST).status_code in (200, 202)
        assert rollup_job.refresh(rt.sessions, lag_seconds=0).rebuilt
        more = clean(40, "v1", 2)
        assert c.post("/v1/conversations", json=more, headers=INGEST).status_code == 202
        late = _task_successes(more[:30] + first[40:50], "b") + _task_successes(first[:5], "c", value=0)
        assert c.post("/v1/outcomes", json=late, headers=INGEST).status_code in (200, 202)
        assert not rollup_job.refresh(rt.sessions, lag_seconds=0).rebuilt  # members recorded incrementally

        _a_tail(c, more[:28], 3)
        small, tasks, outcomes = _tail_read(rt)
        assert tasks == _direct_tasks(rt, "v1") and outcomes == _direct_outcomes(rt)

        rollup_job.refresh(rt.sessions, lag_seconds=0)
        bulk = clean(700, "v1", 4)
        assert c.post("/v1/conversations", json=bulk, headers=INGEST).status_code == 202
        assert c.post("/v1/outcomes", json=_task_successes(bulk, "d"), headers=INGEST).status_code in (200, 202)
        rollup_job.refresh(rt.sessions, lag_seconds=0)

        _a_tail(c, bulk, 5)
        large, tasks, outcomes = _tail_read(rt)
        assert tasks == _direct_tasks(rt, "v1") and outcomes == _direct_outcomes(rt)
        assert large < 2 * small, (small, large)
    rt.close()
