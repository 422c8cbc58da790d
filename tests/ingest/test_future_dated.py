"""A conversation dated more than 5 minutes ahead of the server's clock is refused on every way in, as an
outcome is: its items named (field, the server's clock, the allowance), the rest of the batch stored, the
refused item kept as an ``occurred_in_future`` dead letter that is taken once the clock has passed it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

import vigil.schema
from tests.support.app import ADMIN, INGEST, REVIEWER, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.runtime import Envelope, Runtime
from vigil.schema import Conversation, LatestAllowed
from vigil.store.models import ConversationRow, DeadLetterRow, OutcomeRow

PAST = datetime.now(UTC) - timedelta(days=1)


def sim(n: int, seed: int = 1) -> list[dict[str, Any]]:
    return list(Simulator(parse_versions("v1:0.0"), seed).stream(n, start=PAST))


def ahead(hours: float = 2.0) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat()


def stored_ids(rt: Runtime) -> set[str]:
    with rt.sessions() as s:
        return set(s.scalars(select(ConversationRow.conversation_id)))


def letters(rt: Runtime) -> list[DeadLetterRow]:
    with rt.sessions() as s:
        rows = list(s.scalars(select(DeadLetterRow).order_by(DeadLetterRow.id)))
        s.expunge_all()
        return rows


def child_span(trace: int, n: int, at: datetime, cid: str, **attributes: str) -> dict[str, Any]:
    """Span ``n`` of trace ``trace`` (its root still open), conversation ``cid``, an assistant reply ``step n``
    stamped ``n`` seconds after ``at``."""
    said = orjson.dumps([{"role": "assistant", "parts": [{"type": "text", "content": f"step {n}"}]}]).decode()
    ns = int((at + timedelta(seconds=n)).timestamp() * 1e9)
    return {
        "trace_id": f"{trace:032x}",
        "span_id": f"{n:016x}",
        "parent_span_id": "00000000000000ff",
        "name": "chat m",
        "kind": 3,
        "start_ns": ns,
        "end_ns": ns + 1_000_000,
        "attributes": {**attributes, "gen_ai.conversation.id": cid, "gen_ai.output.messages": said},
        "events": [],
        "status": {"code": 0, "message": ""},
        "resource": {"service.name": "skewed-agent"},
    }


@pytest.fixture
def rt_client(sqlite_url: str) -> Iterator[tuple[Runtime, Any]]:
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    with make_client(rt) as c:
        yield rt, c
    rt.close()


def test_a_conversation_dated_ahead_is_refused_naming_the_field_and_the_clock(rt_client) -> None:
    rt, c = rt_client
    conv = dict(sim(1)[0], ended_at=ahead())
    r = c.post("/v1/conversations", json=conv, headers=INGEST)
    assert r.status_code == 422, r.text
    [error] = r.json()["errors"]
    assert error["reason"] == "occurred_in_future"
    [field] = error["errors"]
    assert field["field"] == "ended_at"
    message = field["message"]
    assert "is in the future" in message and "this server's clock reads" in message and "5 minutes" in message
    assert "UTC offset" not in message  # sent with its offset: no hint
    assert stored_ids(rt) == set()
    [letter] = letters(rt)
    assert (letter.reason, letter.source) == ("occurred_in_future", "http")
    assert "ended_at" in letter.detail and orjson.loads(letter.raw)["conversation_id"] == conv["conversation_id"]


def test_a_batch_keeps_its_other_conversations_and_names_each_time_ahead(rt_client) -> None:
    rt, c = rt_client
    good1, bad, good2 = sim(3)
    bad["messages"][3]["timestamp"] = ahead(48)
    bad["started_at"] = ahead(1)
    r = c.post("/v1/conversations", json=[good1, bad, good2], headers=INGEST)
    assert r.status_code == 422, r.text
    body = r.json()
    assert (body["accepted"], body["stored"], body["rejected"]) == (2, 2, 1)
    [error] = body["errors"]
    assert (error["index"], error["reason"]) == (1, "occurred_in_future")
    assert [e["field"] for e in error["errors"]] == ["started_at", "messages.3.timestamp"]
    assert stored_ids(rt) == {good1["conversation_id"], good2["conversation_id"]}
    dead = c.get("/v1/dead-letters", params={"reason": "occurred_in_future"}, headers=ADMIN).json()
    assert len(dead) == 1 and "item 1: started_at" in dead[0]["detail"] and "messages.3.timestamp" in dead[0]["detail"]


def test_an_inline_outcome_dated_ahead_refuses_its_conversation(rt_client) -> None:
    """An outcome carried with its conversation is stored with it: dated ahead, it is refused as
    ``POST /v1/outcomes`` refuses one, and the conversation with it (kept whole as a dead letter)."""
    rt, c = rt_client
    conv = sim(1)[0]
    conv["outcomes"] = [{"type": "escalation"}, {"type": "refund_reversal", "occurred_at": ahead(48)}]
    r = c.post("/v1/conversations", json=conv, headers=INGEST)
    assert r.status_code == 422, r.text
    [error] = r.json()["errors"]
    [field] = error["errors"]
    assert (error["reason"], field["field"]) == ("occurred_in_future", "outcomes.1.occurred_at")
    assert "send the outcome once it has happened" in field["message"]
    with rt.sessions() as s:
        assert s.scalars(select(OutcomeRow)).all() == []
    assert stored_ids(rt) == set()


def test_a_time_without_an_offset_is_told_it_was_read_as_utc(rt_client) -> None:
    """An agent host's local wall time east of UTC, sent without its offset, is hours ahead in UTC."""
    _, c = rt_client
    local = datetime.now(timezone(timedelta(hours=9))).replace(tzinfo=None, microsecond=0).isoformat()
    naive, aware = sim(2)
    naive["started_at"] = naive["ended_at"] = naive["messages"][1]["timestamp"] = local
    aware["ended_at"] = ahead(1)
    r = c.post("/v1/conversations", json=[naive, aware], headers=INGEST)
    assert r.status_code == 422, r.text
    by_index = {e["index"]: e["errors"] for e in r.json()["errors"]}
    assert [e["field"] for e in by_index[0]] == ["started_at", "ended_at", "messages.1.timestamp"]
    assert all(f"{local!r} has no UTC offset, so it is read as UTC" in e["message"] for e in by_index[0])
    assert "UTC offset" not in by_index[1][0]["message"]


class Frozen(datetime):
    """A ``datetime`` whose ``now()`` is :attr:`at` (moved by the test)."""

    at = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)

    @classmethod
    def now(cls, tz=None):  # type: ignore[no-untyped-def,override]
        return cls.at if tz is None else cls.at.astimezone(tz)


def test_the_allowance_is_taken_to_the_microsecond_and_a_refused_one_is_taken_once_the_clock_has_passed(
    rt_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, c = rt_client
    monkeypatch.setattr(vigil.schema, "datetime", Frozen)
    edge = Frozen.at + timedelta(minutes=5)
    inside, over = (dict(conv, started_at=PAST.isoformat()) for conv in sim(2))
    inside["ended_at"] = edge.isoformat()
    over["ended_at"] = (edge + timedelta(microseconds=1)).isoformat()
    r = c.post("/v1/conversations", json=[inside, over], headers=INGEST)
    assert r.status_code == 422, r.text
    assert [(e["index"], e["reason"]) for e in r.json()["errors"]] == [(1, "occurred_in_future")]
    message = r.json()["errors"][0]["errors"][0]["message"]
    assert "clock reads 2026-12-07T12:00:00+00:00" in message and "(up to 2026-12-07T12:05:00+00:00)" in message
    assert stored_ids(rt) == {inside["conversation_id"]}
    # the dead letter keeps the item as sent: sent again once the clock has passed it, it is stored
    [letter] = letters(rt)
    Frozen.at += timedelta(seconds=1)
    r = c.post("/v1/conversations", content=letter.raw, headers=INGEST)
    assert r.status_code == 202, r.text
    assert stored_ids(rt) == {inside["conversation_id"], over["conversation_id"]}


def test_a_growing_conversations_next_revision_dated_ahead_is_refused_and_the_stored_one_kept(rt_client) -> None:
    rt, c = rt_client
    first = dict(sim(1)[0], status="in_progress")
    assert c.post("/v1/conversations", json=first, headers=INGEST).status_code == 202
    grown = dict(first, revision=2, status="finished", ended_at=ahead(3))
    grown["messages"] = [*first["messages"], {"role": "user", "content": "thanks", "timestamp": ahead(3)}]
    r = c.post("/v1/conversations", json=grown, headers=INGEST)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["errors"][0]["errors"]] == [
        "ended_at",
        f"messages.{len(grown['messages']) - 1}.timestamp",
    ]
    kept = c.get(f"/v1/conversations/{first['conversation_id']}", headers=REVIEWER).json()
    assert kept["revision"] == 1


def test_a_kafka_message_dated_ahead_is_a_dead_letter_at_its_offset(sqlite_url: str) -> None:
    registry = CollectorRegistry()
    rt = wire(build_runtime(make_settings(sqlite_url), registry=registry), {"consume"})
    good1, bad, good2 = sim(3)
    bad["updated_at"] = ahead(5)
    envs = [
        Envelope(orjson.dumps(conv), "kafka", "conversations", 0, 40 + n) for n, conv in enumerate([good1, bad, good2])
    ]
    result = rt.pipeline.process_raw(envs)
    assert len(result.stored) == 2
    assert stored_ids(rt) == {good1["conversation_id"], good2["conversation_id"]}
    [letter] = letters(rt)
    assert (letter.reason, letter.topic, letter.offset) == ("occurred_in_future", "conversations", 41)
    assert letter.detail.startswith("updated_at ")
    assert (
        registry.get_sample_value("vigil_dead_letters_total", {"reason": "occurred_in_future", "source": "kafka"}) == 1
    )
    rt.close()


def test_conversations_built_in_code_are_checked_too(sqlite_url: str) -> None:
    """``vigil replay`` and the demo hand conversations to the same decoder: one dated ahead is a dead
    letter keyed by its id."""
    rt = wire(build_runtime(make_settings(sqlite_url), registry=CollectorRegistry()), {"replay"})
    good, bad = (Conversation.model_validate(c) for c in sim(2))
    bad = bad.model_copy(update={"ended_at": datetime.now(UTC) + timedelta(hours=2)})
    result = rt.pipeline.process([good, bad], "replay")
    assert [i.conversation_id for i in result.stored] == [good.conversation_id]
    [letter] = letters(rt)
    assert (letter.reason, letter.key, letter.source) == ("occurred_in_future", bad.conversation_id, "replay")
    rt.close()


def test_an_otlp_conversation_whose_spans_are_dated_ahead_is_a_dead_letter(sqlite_url: str) -> None:
    """Span times are the exporting host's clock: a conversation assembled from spans ahead of now is refused
    as one sent ahead would be (said in the answer, kept as a dead letter); its spans stay stored."""
    s = make_settings(sqlite_url, judge_mode="offline", otlp_progress_interval_seconds=0)
    rt = wire(build_runtime(s, registry=CollectorRegistry()), {"api"})
    ingest = rt.get(TraceIngest)
    said = orjson.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "hi"}]}]).decode()

    def root(trace: str, key: str, start: datetime) -> dict[str, Any]:
        ns = int(start.timestamp() * 1e9)
        return {
            "trace_id": trace,
            "span_id": "00000000000000ff",
            "parent_span_id": None,
            "name": "chat m",
            "kind": 3,
            "start_ns": ns,
            "end_ns": ns + 1_000_000,
            "attributes": {
                "gen_ai.operation.name": "chat",
                "gen_ai.conversation.id": key,
                "gen_ai.output.messages": said,
            },
            "events": [],
            "status": {"code": 0, "message": ""},
            "resource": {"service.name": "skewed-agent"},
        }

    res = ingest.ingest(
        [
            root(f"{1:032x}", "on-time", datetime.now(UTC)),
            root(f"{2:032x}", "ahead", datetime.now(UTC) + timedelta(hours=2)),
        ]
    )
    assert stored_ids(rt) == {"on-time"}
    assert any("conversation ahead: started_at" in p and "in the future" in p for p in res.problems), res.problems
    [letter] = letters(rt)
    assert (letter.reason, letter.source, letter.key) == ("occurred_in_future", "otlp", "ahead")
    assert orjson.loads(letter.raw)["conversation_id"] == "ahead"
    rt.close()


def test_a_body_in_another_format_dated_ahead_is_refused_and_kept(rt_client) -> None:
    """``?format=``: converted, then checked as a native conversation; the refused one is a dead letter."""
    rt, c = rt_client

    def run(sid: str, start: str) -> dict[str, Any]:
        return {"id": sid, "task_id": "t", "start_time": start, "messages": [{"role": "user", "content": "hi"}]}

    body = {
        "info": {"environment_info": {"domain_name": "retail"}, "agent_info": {"llm": "m"}},
        "tasks": [],
        "simulations": [run("past", PAST.isoformat()), run("ahead", ahead(2))],
    }
    r = c.post("/v1/conversations?format=tau2", json=body, headers=INGEST)
    assert r.status_code == 422, r.text
    [error] = r.json()["errors"]
    assert (error["index"], error["reason"], error["errors"][0]["field"]) == (1, "occurred_in_future", "started_at")
    assert stored_ids(rt) == {"tau2:retail:past"}
    [letter] = letters(rt)
    assert letter.reason == "occurred_in_future" and orjson.loads(letter.raw)["conversation_id"] == "tau2:retail:ahead"


def test_a_growing_otlp_conversation_dated_ahead_waits_its_progress_interval_as_a_stored_one_does(
    db_url: str,
) -> None:
    """A refused revision left the conversation never processed: every later request touching it read all its
    spans back, assembled it again and kept another dead letter of the whole conversation, where a stored
    revision waits ``VIGIL_OTLP_PROGRESS_INTERVAL_SECONDS``."""
    from sqlalchemy import update

    from vigil.ingest.otlp.models import OtelConversationRow

    s = make_settings(db_url, judge_mode="offline", otlp_progress_interval_seconds=600)
    rt = wire(build_runtime(s, registry=CollectorRegistry()), {"api"})
    ingest = rt.get(TraceIngest)
    start = datetime.now(UTC) + timedelta(hours=2)

    def child(n: int) -> dict[str, Any]:
        return child_span(3, n, start, "ahead", **{"gen_ai.operation.name": "chat"})

    assert ingest.ingest([child(1)]).pending == ["ahead"]  # it just began: waits
    with rt.sessions.begin() as session:  # began an interval ago: its first revision is due
        session.execute(update(OtelConversationRow).values(first_seen_at=datetime.now(UTC) - timedelta(hours=1)))
    res = ingest.ingest([child(2)])
    assert any("conversation ahead:" in p for p in res.problems), res.problems
    assert [letter.reason for letter in letters(rt)] == ["occurred_in_future"]
    for n in range(3, 6):
        assert ingest.ingest([child(n)]).pending == ["ahead"]
    assert len(letters(rt)) == 1 and stored_ids(rt) == set()
    rt.close()


def test_a_conversation_with_thousands_of_times_ahead_builds_only_the_errors_it_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each time ahead cost a formatted message (and a parse of the time as sent, for the hint), where the
    answer keeps 20 and the letter's detail 5: a conversation of 5,000 messages dated ahead built 5,000."""
    from vigil.ingest.decode import DecodeError, decode_document

    built = 0
    real = vigil.schema.in_future

    def counted(*args: Any, **kwargs: Any) -> dict[str, str]:
        nonlocal built
        built += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(vigil.schema, "in_future", counted)
    conv = sim(1)[0]
    later = ahead(1)
    conv["messages"] = [{"role": "user", "content": f"m{i}", "timestamp": later} for i in range(5_000)]
    with pytest.raises(DecodeError) as refused:
        decode_document(orjson.dumps(conv), 10**8, latest=vigil.schema.latest_allowed())
    assert refused.value.reason == "occurred_in_future"
    assert [e["field"] for e in refused.value.errors] == [f"messages.{i}.timestamp" for i in range(20)]
    assert refused.value.detail.startswith("messages.0.timestamp ")
    assert refused.value.detail.endswith("; ... and 4995 more")
    assert built <= 20


def test_the_allowance_is_exact_to_the_microsecond_whatever_the_offset() -> None:
    """Times compare with the latest one on their own offset's wall clock: at the edge, in any offset, mixed
    in one conversation, naive (UTC), or in a zone built in code, one microsecond over is refused."""
    from zoneinfo import ZoneInfo

    from vigil.ingest.decode import DecodeError, decode_document

    latest = datetime(2026, 12, 7, 12, 5, tzinfo=UTC)
    offsets = [timezone(timedelta(hours=h, minutes=m)) for h, m in ((9, 0), (-5, 0), (5, 45), (0, 0), (-12, 0))]
    edges = [latest.astimezone(tz) for tz in offsets] + [latest.replace(tzinfo=None)]
    conv = sim(1)[0]
    conv["messages"] = [
        {"role": "user", "content": f"m{i}", "timestamp": (edge + timedelta(microseconds=over)).isoformat()}
        for i, (edge, over) in enumerate((e, o) for e in edges for o in (0, -1, 1, 0))
    ]
    with pytest.raises(DecodeError) as refused:
        decode_document(orjson.dumps(conv), 10**8, latest=LatestAllowed(latest))
    assert [e["field"] for e in refused.value.errors] == [f"messages.{4 * k + 2}.timestamp" for k in range(len(edges))]
    for over, found in ((0, 0), (1, 1)):
        model = Conversation.model_validate(sim(1)[0])
        at = latest.astimezone(ZoneInfo("Asia/Tokyo")) + timedelta(microseconds=over)
        model.messages[0] = model.messages[0].model_copy(update={"timestamp": at})
        assert vigil.schema.conversation_in_future(model, LatestAllowed(latest))[1] == found


def test_the_idle_finisher_finishes_a_conversation_still_ahead_unstored_and_a_later_span_brings_it_back(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As docs/schema.md says: the idle finisher tries once; a span that comes after the clock has passed
    the conversation's times assembles it again, and it is stored."""
    s = make_settings(sqlite_url, judge_mode="offline", otlp_progress_interval_seconds=0)
    rt = wire(build_runtime(s, registry=CollectorRegistry()), {"api"})
    ingest = rt.get(TraceIngest)
    start = datetime.now(UTC) + timedelta(hours=2)

    def child(n: int) -> dict[str, Any]:
        return child_span(4, n, start, "late")

    ingest.ingest([child(1)])
    idle_at = datetime.now(UTC) + timedelta(hours=1)
    assert ingest.finish_idle("me", now=idle_at) == []  # still ahead: refused, finished unstored
    assert ingest.finish_idle("me", now=idle_at + timedelta(hours=1)) == []  # not claimed again
    assert stored_ids(rt) == set() and [x.reason for x in letters(rt)] == ["occurred_in_future"] * 2
    monkeypatch.setattr(Frozen, "at", datetime.now(UTC) + timedelta(hours=3))  # the clock has passed its times
    monkeypatch.setattr(vigil.schema, "datetime", Frozen)
    ingest.ingest([child(2)])
    assert stored_ids(rt) == {"late"}
    rt.close()


def test_a_growing_otlp_conversation_dated_ahead_leaves_a_letter_when_first_refused_and_when_finished(
    db_url: str,
) -> None:
    """Each revision assembled while the trace grows is refused again, but only the first and the finished
    one are kept as dead letters: a letter every progress interval would fill the dead-letter table with
    copies of one conversation and hold DeadLettersRising up for as long as the trace grows."""
    s = make_settings(db_url, judge_mode="offline", otlp_progress_interval_seconds=0)
    rt = wire(build_runtime(s, registry=CollectorRegistry()), {"api"})
    ingest = rt.get(TraceIngest)
    start = datetime.now(UTC) + timedelta(hours=2)

    def child(n: int) -> dict[str, Any]:
        return child_span(5, n, start, "growing")

    for n in range(1, 6):  # every request assembles it (no progress interval) and refuses it
        res = ingest.ingest([child(n)])
        assert any("conversation growing:" in p for p in res.problems), (n, res.problems)
    assert [x.reason for x in letters(rt)] == ["occurred_in_future"]
    assert ingest.finish_idle("me", now=datetime.now(UTC) + timedelta(hours=3)) == []
    kept = letters(rt)
    assert [x.reason for x in kept] == ["occurred_in_future"] * 2 and stored_ids(rt) == set()
    assert b"step 5" in kept[-1].raw and b"step 1" in kept[-1].raw  # the finished letter holds every span
    rt.close()


def test_vigil_import_dry_run_names_what_storing_would_refuse_as_dated_ahead(tmp_path: Any) -> None:
    """``--dry-run`` reads and checks a file without storing it: it passed one that the real import then
    refused, conversation by conversation, as dated ahead."""
    from typer.testing import CliRunner

    from vigil.app.cli import app

    good, later = sim(2)
    later["started_at"] = ahead()
    f = tmp_path / "skewed.jsonl"
    f.write_bytes(b"\n".join(orjson.dumps(c) for c in (good, later)) + b"\n")
    result = CliRunner().invoke(app, ["import", "--dry-run", str(f)], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert f"conversation {later['conversation_id']}:" in result.output and "started_at" in result.output
    assert f"conversation {good['conversation_id']}:" not in result.output
    assert "read 2 conversations, refused 1" in result.output


def test_an_otlp_conversation_stored_then_dated_ahead_leaves_a_letter_when_first_refused(db_url: str) -> None:
    """A revision of the conversation was stored before its exporter's clock jumped ahead: the first refused
    revision is kept as a letter (it was not: a stored revision counted as a refused one), not every one."""
    s = make_settings(db_url, judge_mode="offline", otlp_progress_interval_seconds=0)
    rt = wire(build_runtime(s, registry=CollectorRegistry()), {"api"})
    ingest = rt.get(TraceIngest)
    now = datetime.now(UTC)

    def child(n: int, at: datetime) -> dict[str, Any]:
        return child_span(6, n, at, "jumped")

    ingest.ingest([child(1, now - timedelta(minutes=1))])
    assert stored_ids(rt) == {"jumped"} and letters(rt) == []
    for n in range(2, 5):  # the exporter's clock now runs two hours ahead: each revision is refused
        res = ingest.ingest([child(n, now + timedelta(hours=2))])
        assert any("conversation jumped:" in p for p in res.problems), (n, res.problems)
    assert [x.reason for x in letters(rt)] == ["occurred_in_future"]
    rt.close()
