"""Hostile input to the importers and the decoder: conversations or a refusal naming where, never a crash.

A field of the wrong type in any format is refused by name (a 422 and a dead letter over HTTP, exit 2 from
``vigil import``); a lone surrogate in an object key or an integer beyond Python's digit limit refuses its
item only; a JSON line ``vigil import`` cannot read is named and the others are imported.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.app import ADMIN, INGEST, REVIEWER
from tests.support.cli import cli_runner
from vigil.ingest.decode import DecodeError, decode_batch, decode_document
from vigil.ingest.importers import ImportError_, convert_data, matches

OPENAI = {
    "model": "gpt-4.1",
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "messages": [
        {"role": "developer", "content": "You answer weather questions."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "It is 18 °C."},
    ],
}
ANTHROPIC = {
    "model": "claude-sonnet-4-5",
    "system": [{"type": "text", "text": "You are the refunds agent."}],
    "messages": [{"role": "user", "content": "Refund order 881."}],
    "response": {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Refund started."}],
        "stop_reason": "end_turn",
    },
}
AGENTS = {
    "data": [
        {"object": "trace", "id": "trace_1", "workflow_name": "Shop"},
        {
            "object": "trace.span",
            "id": "span_a1",
            "trace_id": "trace_1",
            "span_data": {"type": "agent", "name": "Shop agent", "handoffs": [], "tools": ["get_order"]},
        },
        {
            "object": "trace.span",
            "id": "span_g1",
            "trace_id": "trace_1",
            "span_data": {
                "type": "generation",
                "input": [{"role": "user", "content": "Cancel order #W1"}],
                "output": [{"role": "assistant", "content": "Cancelled.", "tool_calls": []}],
            },
        },
    ]
}
LANGSMITH = {
    "id": "run-1",
    "name": "shop_agent",
    "run_type": "chain",
    "inputs": {"question": "Cancel #W1"},
    "outputs": {},
    "child_runs": [
        {
            "id": "run-2",
            "run_type": "llm",
            "inputs": {"messages": [[{"type": "human", "content": "Cancel #W1"}]]},
            "outputs": {"generations": [[{"message": {"type": "ai", "content": "Cancelled.", "tool_calls": []}}]]},
        }
    ],
}
TAU2 = {
    "info": {"environment_info": {"domain_name": "retail"}, "agent_info": {"llm": "gpt-4.1"}},
    "tasks": [{"id": "0"}],
    "simulations": [
        {"id": "sim-1", "task_id": "0", "reward_info": {"reward": 1.0}, "messages": [{"role": "user", "content": "hi"}]}
    ],
}
TAU_BENCH = [{"task_id": 3, "reward": 1.0, "trial": 0, "traj": [{"role": "user", "content": "Cancel #W2."}]}]


def _with(sample: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(sample)
    cur = out
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value
    return out


# (sample, field set to a value of the wrong type, the value, what the refusal names)
WRONG_TYPES = {
    "openai tools": (OPENAI, ("tools",), -1, "item 0.tools"),
    "anthropic system text": (ANTHROPIC, ("system", 0, "text"), -1, "item 0.system.0.text"),
    "anthropic response content": (ANTHROPIC, ("response", "content"), -1, "item 0.response.content"),
    "agents span tools": (AGENTS, ("data", 1, "span_data", "tools"), -1, "span_data.tools"),
    "agents span handoffs": (AGENTS, ("data", 1, "span_data", "handoffs"), -1, "span_data.handoffs"),
    "agents output tool_calls": (AGENTS, ("data", 2, "span_data", "output", 0, "tool_calls"), -1, "tool_calls"),
    "langsmith child_runs": (LANGSMITH, ("child_runs",), -1, "run run-1.child_runs"),
    "langsmith tool_calls": (
        LANGSMITH,
        ("child_runs", 0, "outputs", "generations", 0, 0, "message", "tool_calls"),
        -1,
        "tool_calls",
    ),
    "tau2 tasks": (TAU2, ("tasks",), "x", "tasks: expected a list"),
    "tau2 reward": (TAU2, ("simulations", 0, "reward_info", "reward"), "x", "reward_info.reward: expected a number"),
    "tau-bench reward": (TAU_BENCH, (0, "reward"), "", "item 0: reward: expected a number"),
    "openai role beyond 64 bits": (OPENAI, ("messages", 0, "role"), 10**30, "messages.0.role"),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_importers_refuse_a_field_of_the_wrong_type_naming_it(case: str) -> None:
    """Each format's converter, detected or named, refuses a wrongly typed field by where it is, never with a
    TypeError, ValueError or AttributeError of its own."""
    sample, path, value, named = WRONG_TYPES[case]
    data = _with(sample, path, value)
    for fmt in ("auto", convert_data(sample).format):
        with pytest.raises(ImportError_) as err:
            convert_data(data, fmt)
        assert named in str(err.value), (fmt, str(err.value))


def test_auto_detection_survives_markers_of_the_wrong_type() -> None:
    """The detectors look at every format's data: Anthropic's and OpenAI's markers read ``tools`` and
    ``messages`` of any type without failing, so detection still names the format (or refuses the shape)."""
    record = {"system": "You answer weather questions.", "tools": -1, "messages": [{"role": "user", "content": "hi"}]}
    assert set(matches(record)) == {"anthropic"}
    assert set(matches({"messages": [{"role": "user", "content": "hi"}], "tools": {"a": 1}})) == {"openai"}
    with pytest.raises(ImportError_, match="tools: expected a list of tool definitions"):
        convert_data(record)


def test_an_importer_failing_unexpectedly_is_refused_naming_the_format(monkeypatch: pytest.MonkeyPatch) -> None:
    """The safety net: whatever error a converter raises on a value it did not check for becomes a refusal
    naming the format and how far the reading got."""
    from vigil.ingest.importers import openai

    real = openai.convert

    def fragile(data: Any, *args: Any) -> Any:
        yield from real(data[:1], *args)
        raise TypeError("'int' object is not iterable")

    monkeypatch.setattr(openai, "convert", fragile)
    with pytest.raises(ImportError_) as err:
        convert_data([OPENAI, OPENAI], "openai")
    text = str(err.value)
    assert text.startswith("body: not readable as openai (after 1 conversation(s) read)")
    assert "TypeError: 'int' object is not iterable" in text


def test_http_format_ingest_answers_422_with_a_dead_letter_for_a_wrongly_typed_field(client: Any) -> None:
    """``POST /v1/conversations?format=...`` with a wrongly typed field: a 422 schema_invalid refusal naming
    the field, kept as a dead letter; never a 500."""
    for case in ("tau-bench reward", "anthropic system text", "langsmith child_runs"):
        sample, path, value, named = WRONG_TYPES[case]
        r = client.post("/v1/conversations?format=auto", json=_with(sample, path, value), headers=INGEST)
        assert r.status_code == 422, r.text
        assert r.json()["reason"] == "schema_invalid" and named in r.json()["detail"]
    letters = client.get("/v1/dead-letters", headers=ADMIN).json()
    assert [d["reason"] for d in letters] == ["schema_invalid"] * 3
    assert any("reward: expected a number" in d["detail"] for d in letters)


def test_http_format_ingest_refuses_an_importer_crash_as_schema_invalid(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should an importer error ever escape ``convert_data``, the endpoint still answers the refusal (422,
    schema_invalid, naming the format) and keeps the body as a dead letter."""
    import vigil.ingest.importers as importers

    def crash(*_args: Any) -> Any:
        raise AttributeError("'str' object has no attribute 'get'")

    monkeypatch.setattr(importers, "convert_data", crash)
    r = client.post("/v1/conversations?format=tau2", json=TAU2, headers=INGEST)
    assert r.status_code == 422, r.text
    assert r.json()["reason"] == "schema_invalid" and "not readable as tau2" in r.json()["detail"]
    [letter] = client.get("/v1/dead-letters", headers=ADMIN).json()
    assert letter["reason"] == "schema_invalid"


def test_native_ingest_hint_survives_another_formats_fields_of_the_wrong_type(client: Any) -> None:
    """A schema-invalid item looks for a format that would read it (the hint): an Anthropic-looking item
    whose ``tools`` is a number is refused as schema_invalid, not a 500."""
    item = {
        "conversation_id": "c-1",
        "agent_id": "a",
        "agent_version": "v",
        "system": "You are the refunds agent.",
        "tools": -1,
        "messages": [{"role": "user", "content": "hi"}],
    }
    r = client.post("/v1/conversations", json=item, headers=INGEST)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["reason"] == "schema_invalid"


def test_vigil_import_refuses_a_wrongly_typed_field_with_exit_2(tmp_path: Path) -> None:
    """``vigil import`` on a file with a wrongly typed field names the file and field and exits 2; no
    traceback."""
    from vigil.app.cli import app

    path = tmp_path / "runs.json"
    path.write_bytes(orjson.dumps(_with(TAU_BENCH, (0, "reward"), "")))
    result = cli_runner().invoke(app, ["import", "--dry-run", str(path)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"{path}: item 0: reward: expected a number" in result.output


# --- the decoder -------------------------------------------------------------------------------------

GOOD = b'{"conversation_id":"good","agent_id":"a","agent_version":"v","messages":[{"role":"user","content":"x"}]}'


def _bad(metadata: str) -> bytes:
    return (
        b'{"conversation_id":"bad","agent_id":"a","agent_version":"v","metadata":%s,'
        b'"messages":[{"role":"user","content":"x"}]}' % metadata.encode()
    )


def test_a_lone_surrogate_in_a_key_refuses_its_item_with_an_encodable_field() -> None:
    """The field path of a key holding a lone surrogate is escaped, so the refusal (and its dead letter)
    can be stored; the other items of the batch are kept."""
    batch = decode_batch(b"[" + GOOD + b"," + _bad('{"\\udc00": 1}') + b"]", 1_000_000, 1000)
    good, bad = batch.items
    assert good.conversation is not None and bad.error is not None
    assert bad.error.reason == "invalid_unicode"
    assert bad.error.errors[0]["field"] == "metadata.\\udc00"
    (bad.error.detail + bad.error.errors[0]["field"]).encode()  # storable text


def test_http_batch_with_a_surrogate_key_keeps_the_good_item_and_a_dead_letter(client: Any) -> None:
    """Over HTTP the good item is stored and the bad one is kept as an invalid_unicode dead letter."""
    body = b"[" + GOOD + b"," + _bad('{"\\udc00": 1}') + b"]"
    r = client.post("/v1/conversations", content=body, headers={**INGEST, "content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["stored"] == 1 and r.json()["errors"][0]["reason"] == "invalid_unicode"
    assert client.get("/v1/conversations/good", headers=REVIEWER).status_code == 200
    [letter] = client.get("/v1/dead-letters", headers=ADMIN).json()
    assert letter["reason"] == "invalid_unicode" and "metadata.\\udc00" in letter["detail"]


@pytest.mark.parametrize("digits", [4301, 5000, 20000])
def test_an_integer_beyond_pythons_digit_limit_refuses_its_item_only(digits: int) -> None:
    """An integer of more digits than Python makes an int of (4,300) is beyond a double's range like one of
    400 digits: its item is refused as non_finite_number, naming the field; the batch is not malformed."""
    batch = decode_batch(b"[" + GOOD + b"," + _bad('{"n": -%s}' % ("9" * digits)) + b"]", 1_000_000, 1000)
    good, bad = batch.items
    assert good.conversation is not None
    assert bad.error is not None and bad.error.reason == "non_finite_number"
    assert bad.error.errors[0]["field"] == "metadata.n"
    with pytest.raises(DecodeError) as err:
        decode_document(_bad('{"n": %s}' % ("9" * digits)), 1_000_000)
    assert err.value.reason == "non_finite_number"


# --- vigil import keeps what it can read -------------------------------------------------------------


def _line(cid: str) -> bytes:
    return orjson.dumps(
        {"conversation_id": cid, "agent_id": "a", "agent_version": "v", "messages": [{"role": "user", "content": "hi"}]}
    )


def test_vigil_import_keeps_the_good_lines_and_names_the_bad_ones(tmp_path: Path, sqlite_url: str) -> None:
    """A JSONL line that is not JSON, or a record the format refuses, is named by line and file and kept as
    a dead letter; every other line, and every other file, is stored; the command exits 2 with a summary."""
    from tests.support.app import make_client, make_settings
    from vigil.app.cli import app
    from vigil.app.runtime import build_runtime

    good = tmp_path / "good.jsonl"
    good.write_bytes(b"\n".join([_line("jl-0"), _line("jl-1")]) + b"\n")
    mixed = tmp_path / "mixed.jsonl"
    wrong = orjson.dumps({"conversation_id": "jl-4", "agent_id": "a", "messages": [{"role": "robot"}]})
    broken = b'{"conversation_id": "jl-3", "agent_id": broken'
    mixed.write_bytes(b"\n".join([_line("jl-2"), broken, wrong, _line("jl-5")]))
    env = {"VIGIL_DATABASE_URL": sqlite_url, "VIGIL_METRICS_PORT": "0"}
    result = cli_runner(env=env).invoke(app, ["import", str(good), str(mixed)])
    assert result.exit_code == 2, result.output
    assert "stored 4, refused 2:" in result.output
    assert f"line 2 of {mixed}: not JSON" in result.output
    assert f"line 3 of {mixed}: messages.0.role" in result.output
    rt = build_runtime(make_settings(sqlite_url))
    with make_client(rt) as c:
        listed = c.get("/v1/conversations", headers=REVIEWER).json()
        assert sorted(x["conversation_id"] for x in listed["items"]) == ["jl-0", "jl-1", "jl-2", "jl-5"]
        letters = c.get("/v1/dead-letters", headers=ADMIN).json()
        assert sorted(d["reason"] for d in letters) == ["malformed_json", "schema_invalid"]
        assert all(d["source"] == "replay" for d in letters)
    rt.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [("agent_id", "support\nbot"), ("agent_id", "   "), ("agent_version", "v1\x1b[31m"), ("agent_version", "\t")],
)
def test_agent_ids_and_versions_that_cannot_be_labels_refuse_their_item_only(
    client: Any, field: str, value: str
) -> None:
    """An agent id or version is a metric label, a filter in URLs and a column of every page: one with a
    control character, or blank, is refused naming the field; the batch's other items are stored. A stored
    document holding one (from before the rule) is still read."""
    bad = orjson.loads(_line("agent-bad"))
    bad[field] = value
    body = b"[" + _line("agent-good") + b"," + orjson.dumps(bad) + b"]"
    r = client.post("/v1/conversations", content=body, headers={**INGEST, "content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["stored"] == 1 and r.json()["errors"][0]["errors"][0]["field"] == field
    assert client.get("/v1/conversations/agent-good", headers=REVIEWER).status_code == 200
    [letter] = client.get("/v1/dead-letters", headers=ADMIN).json()
    assert letter["reason"] == "schema_invalid"
    from vigil.schema import Conversation

    assert Conversation.model_validate(bad).model_dump()[field] == value  # stored before: read as it is


def test_a_broken_pretty_printed_document_is_refused_once_saying_where_it_breaks(tmp_path: Path) -> None:
    """A JSON document written over many lines, broken somewhere, is one refusal naming the position, not
    a refusal per line (its lines are not JSON lines); a file of JSON lines with a few bad ones keeps the rest."""
    from vigil.ingest.importers import read_file_parts

    # one element per line, as many tools write an array: its last line alone is JSON, the others are not
    doc = b"[\n" + b",\n".join(_line(f"pp-{i}") for i in range(5)) + b"\n]\n"
    broken = tmp_path / "broken.json"
    broken.write_bytes(doc.replace(b'"pp-2"', b'"pp-2" "oops"'))
    [(imported, refused)] = list(read_file_parts(broken))
    assert imported is None and len(refused) == 1
    [r] = refused
    assert r.line is None and r.reason == "malformed_json" and "line" in r.detail and "of its" in r.detail
    lines = tmp_path / "lines.jsonl"
    lines.write_bytes(b"\n".join([_line("ok-1"), b"{broken", _line("ok-2"), _line("ok-3")]))
    [(imported, refused)] = list(read_file_parts(lines))
    assert imported is not None and [c.conversation_id for c in imported.conversations] == ["ok-1", "ok-2", "ok-3"]
    assert [r.line for r in refused] == [2]
