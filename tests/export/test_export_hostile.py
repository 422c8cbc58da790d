"""Hostile conversations never break an export: a task too deeply nested to write is skipped and reported
(the rest is exported), tool schemas that are not what JSON Schema says are read defensively (Inspect's own
``ToolParams`` accepts what the export writes; verifiers registers every tool, also one with a parameter
named ``from``), identifiers Vigil generated are never redacted (content still is), and integers beyond
64 bits in tool-call arguments keep their exact value."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import ADMIN, INGEST, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.export.redact import Redactor
from vigil.export.tasks import group_key
from vigil.store.models import ConversationRow, ReviewLabelRow

FORMATS = ("native", "inspect", "verifiers")


@pytest.fixture
def app(sqlite_url: str) -> Iterator[tuple[Any, Any]]:
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    with make_client(rt) as client:
        yield rt, client
    rt.close()


def _conv(cid: str, **kw: Any) -> dict[str, Any]:
    return {
        "conversation_id": cid,
        "agent_id": "a",
        "agent_version": "1",
        "intent": cid,
        "messages": [{"role": "user", "content": f"hi {cid}"}, {"role": "assistant", "content": "hello"}],
        **kw,
    }


def _ingest(app: tuple[Any, Any], body: bytes | dict[str, Any]) -> None:
    rt, client = app
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    r = client.post("/v1/conversations", content=raw, headers={**INGEST, "Content-Type": "application/json"})
    assert r.status_code in (200, 202), r.text
    cid = orjson.loads(raw)["conversation_id"]
    with rt.sessions.begin() as s:
        s.add(
            ReviewLabelRow(
                conversation_id=cid,
                revision=s.scalar(select(ConversationRow.revision).where(ConversationRow.conversation_id == cid)),
                reviewer="rita",
                label="confirmed_failure",
                version=1,
                is_current=True,
                category="policy_violation",
            )
        )


def _export(client: Any, fmt: str) -> tuple[list[dict[str, Any]], Any]:
    r = client.post("/v1/exports", params={"format": fmt, "all": "true"}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return [orjson.loads(line) for line in r.content.splitlines() if line.strip()], r


def _nested(depth: int) -> str:
    s = '{"type":"object"}'
    for _ in range(depth):
        s = '{"type":"object","properties":{"a":' + s + "}}"
    return s


def _ids(rows: list[dict[str, Any]]) -> set[str]:
    return {(row.get("metadata") or row.get("info") or row)["source"]["conversation_id"] for row in rows}


def test_a_task_too_deep_to_write_is_skipped_and_the_rest_exported(app, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """~260 JSON levels (ingest takes 1024, orjson writes 255): in tool-call arguments no format can write
    the task; in a tool schema the native and verifiers tasks (the schema as stored) cannot, while the
    inspect sample, whose tools are reduced to what Inspect reads, can."""
    rt, client = app
    deep_args = (
        '{"conversation_id":"deep-args","agent_id":"a","agent_version":"1","intent":"deep args","messages":'
        '[{"role":"user","content":"hi"},{"role":"assistant","content":"","tool_calls":[{"id":"c1",'
        '"function":{"name":"t","arguments":NESTED}}]},{"role":"tool","tool_call_id":"c1","content":"r"},'
        '{"role":"assistant","content":"ok"}]}'
    ).replace("NESTED", _nested(130))
    deep_tools = (
        '{"conversation_id":"deep-tools","agent_id":"a","agent_version":"1","intent":"deep tools",'
        '"tools":[{"name":"t","parameters":NESTED}],'
        '"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"ok"}]}'
    ).replace("NESTED", _nested(130))
    _ingest(app, deep_args.encode())
    _ingest(app, deep_tools.encode())
    _ingest(app, _conv("fine"))
    for fmt in FORMATS:
        rows, r = _export(client, fmt)
        if fmt == "inspect":
            assert _ids(rows) == {"fine", "deep-tools"} and r.headers["x-vigil-skipped"] == "1"
            from inspect_ai.tool import ToolParams

            [sample] = [row for row in rows if row["metadata"]["source"]["conversation_id"] == "deep-tools"]
            ToolParams.model_validate(sample["metadata"]["tools"][0]["parameters"])
        else:
            assert _ids(rows) == {"fine"} and r.headers["x-vigil-skipped"] == "2", fmt
        assert r.headers["x-vigil-tasks"] == str(len(rows))

    from vigil.export.run import export

    with rt.sessions.begin() as s:
        result = export(s, {}, Redactor(), "native")
        assert result.tasks == 1 and set(result.skipped) == {"deep-args", "deep-tools"}
        assert all("cannot be written" in why for why in result.skipped.values())
    with rt.sessions.begin() as s:  # the skipped ones were not recorded as exported: tried again next run
        again = export(s, {}, Redactor(), "native")
        assert again.tasks == 0 and set(again.skipped) == {"deep-args", "deep-tools"}

    # an error of the same type that is not a nesting limit is a bug: the run fails instead of skipping
    import vigil.export.run as run_module

    def broken(*_: Any, **__: Any) -> Any:
        raise ValueError("a bug in building tasks")

    monkeypatch.setattr(run_module, "build", broken)
    with rt.sessions.begin() as s, pytest.raises(ValueError, match="a bug"):
        export(s, {}, Redactor(), "native")
    monkeypatch.undo()

    from tests.support.cli import cli_runner
    from vigil.app.cli import app as cli

    monkeypatch.setenv("VIGIL_DATABASE_URL", rt.settings.database_url_str)
    monkeypatch.setenv("VIGIL_RULE_PACKS", rt.settings.rule_packs)
    out = tmp_path / "tasks.jsonl"
    res = cli_runner().invoke(cli, ["export", "--all", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert _ids([orjson.loads(line) for line in out.read_bytes().splitlines()]) == {"fine"}
    assert "skipped deep-args" in res.output and "skipped deep-tools" in res.output


@pytest.mark.parametrize("properties", [["a", "b"], "abc", 7])
def test_tool_properties_that_are_not_an_object(app, properties: Any) -> None:  # type: ignore[no-untyped-def]
    from inspect_ai.tool import ToolParams

    from vigil.export.formats import inspect_tools

    tool = {"type": "function", "function": {"name": "t", "parameters": {"type": "object", "properties": properties}}}
    [info] = inspect_tools([tool])
    assert info["name"] == "t" and info["parameters"]["properties"] == {}
    ToolParams.model_validate(info["parameters"])

    rt, client = app
    _ingest(app, _conv("odd", tools=[{"name": "t", "parameters": {"type": "object", "properties": properties}}]))
    for fmt in FORMATS:
        rows, _ = _export(client, fmt)
        assert len(rows) == 1


def test_generated_identifiers_are_not_redacted_content_is(app) -> None:  # type: ignore[no-untyped-def]
    intent = "order lookup g7026"
    key = group_key("policy_violation", None, intent)
    assert Redactor().text(f"vigil-{key[:20]}") != f"vigil-{key[:20]}"  # the card detector hits this id
    _, client = app
    card_id = "4111111111111111"  # a conversation id that looks like a card is still an id
    _ingest(
        app,
        {
            **_conv(card_id),
            "intent": intent,
            "messages": [
                {"role": "user", "content": "my card is 4111 1111 1111 1111"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "4242424242424242", "function": {"name": "lookup", "arguments": {"q": "x"}}}],
                },
                {"role": "tool", "tool_call_id": "4242424242424242", "content": "found"},
                {"role": "assistant", "content": "done"},
            ],
        },
    )
    [task], _ = _export(client, "native")
    assert task["task_id"] == f"vigil-{key[:20]}" and task["group_key"] == key
    assert task["source"]["conversation_id"] == card_id
    assert task["messages"][1]["tool_calls"][0]["id"] == "4242424242424242"
    assert task["messages"][2]["tool_call_id"] == "4242424242424242"
    assert "4111 1111 1111 1111" not in task["messages"][0]["content"]
    assert "[REDACTED:card]" in task["messages"][0]["content"]
    [sample], _ = _export(client, "inspect")
    assert sample["id"] == task["task_id"] and sample["metadata"]["task_id"] == task["task_id"]
    assert sample["input"][1]["tool_calls"][0]["id"] == "4242424242424242"
    [row], _ = _export(client, "verifiers")
    assert row["id"] == task["task_id"] and card_id in row["name"]


class _MCP:
    def __init__(self) -> None:
        self.tools: list[str] = []

    def add_tool(self, fn: Any, name: str, description: str) -> None:
        self.tools.append(name)


def test_verifiers_registers_every_tool_also_after_a_keyword_parameter(tmp_path: Path) -> None:
    from vigil.export.harness.verifiers_env import VigilToolset, VigilToolsetConfig, _offered

    def tool(name: str, params: Any) -> dict[str, Any]:
        return {"tools": [{"type": "function", "function": {"name": name, "parameters": params}}]}

    rows = [
        tool("good1", {"type": "object", "properties": {"x": {"type": "string"}}}),
        tool("send_email", {"type": "object", "properties": {"from": {"type": "string"}, "to": {"type": "string"}}}),
        tool("odd", {"type": "object", "properties": ["a"], "required": "a"}),
        tool("good2", {}),
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    mcp = _MCP()
    toolset = VigilToolset.__new__(VigilToolset)
    toolset.config = VigilToolsetConfig(path=str(path))
    toolset.register(mcp)
    assert mcp.tools == ["good1", "send_email", "odd", "good2"]
    sig = _offered("send_email", rows[1]["tools"][0]["function"]["parameters"]).__signature__
    assert "to" in sig.parameters and "from" not in sig.parameters


@pytest.mark.parametrize(
    "params",
    [
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": "a"},
        {"type": "object", "properties": {"a": {"type": "foo"}}},
        {"type": "object", "properties": {"a": {"type": ["string", "foo"]}}, "required": ["a", "zz", 3]},
        {"type": "object", "properties": {"a": {"type": "array", "items": "x", "enum": "e"}}},
        {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": 5}}}}},
        {"type": "foo", "properties": {"a": {"minLength": "3", "anyOf": "x"}}, "additionalProperties": "no"},
    ],
)
def test_inspect_tool_schemas_load_in_inspect(params: dict[str, Any]) -> None:
    from inspect_ai.tool import ToolParams

    from vigil.export.formats import inspect_tools
    from vigil.export.harness.inspect_task import tool_def

    [info] = inspect_tools([{"type": "function", "function": {"name": "t", "parameters": params}}])
    ToolParams.model_validate(info["parameters"])
    tool_def(info).as_tool()
    assert set(info["parameters"]["properties"]) == {"a"}
    assert all(r in info["parameters"]["properties"] for r in info["parameters"].get("required", []))


def test_integers_beyond_64_bits_in_tool_arguments_stay_exact(app) -> None:  # type: ignore[no-untyped-def]
    _, client = app
    big = 123456789012345678901234567890
    raw = (
        '{"conversation_id":"big","agent_id":"a","agent_version":"1","intent":"big","messages":'
        '[{"role":"user","content":"hi"},{"role":"assistant","content":"ok","tool_calls":'
        '[{"id":"c1","function":{"name":"t","arguments":{"n":BIG}}}]},'
        '{"role":"tool","tool_call_id":"c1","content":"r"},{"role":"assistant","content":"done"}]}'
    ).replace("BIG", str(big))
    _ingest(app, raw.encode())

    def exported(fmt: str) -> dict[str, Any]:
        r = client.post("/v1/exports", params={"format": fmt, "all": "true"}, headers=ADMIN)
        assert r.status_code == 200, r.text
        [row] = [json.loads(line) for line in r.content.splitlines() if line.strip()]  # Python keeps ints exact
        return row

    def n(args: Any) -> Any:
        return (json.loads(args) if isinstance(args, str) else args)["n"]

    assert n(exported("native")["messages"][1]["tool_calls"][0]["function"]["arguments"]) == big
    assert n(exported("inspect")["input"][1]["tool_calls"][0]["arguments"]) == big
    assert n(exported("verifiers")["prompt"][1]["tool_calls"][0]["arguments"]) == big


def test_pii_inside_json_strings_is_redacted_and_the_json_stays_json(app) -> None:  # type: ignore[no-untyped-def]
    """Tool-call arguments and tool results carry JSON as a string. Redacting its text turned a phone or
    card number written as a JSON number into ``[REDACTED:phone]`` bare (invalid JSON: the exported call
    can no longer be replayed) and missed an address behind a ``\\u0040`` escape; both are now redacted
    value by value, each read under its key, and written back as JSON."""
    arguments = '{"phone": 4155550123, "card": 4111111111111111, "email": "rita\\u0040example.com", "seats": 2}'
    result = '[{"order": "W123", "contact": {"password": "hunter2secret", "zip": 94105}}]'
    _ingest(
        app,
        {
            **_conv("json-pii"),
            "messages": [
                {"role": "user", "content": "change my booking"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "book", "arguments": arguments}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": result},
                {"role": "assistant", "content": "done"},
            ],
        },
    )
    _, client = app
    [task], _ = _export(client, "native")
    args = json.loads(task["messages"][1]["tool_calls"][0]["function"]["arguments"])
    assert args == {"phone": "[REDACTED:phone]", "card": "[REDACTED:card]", "email": "[REDACTED:email]", "seats": 2}
    tool = json.loads(task["messages"][2]["content"])
    assert tool == [{"order": "W123", "contact": {"password": "[REDACTED:secret]", "zip": 94105}}]
    [sample], _ = _export(client, "inspect")
    exported = json.dumps(sample)
    for leaked in ("4155550123", "4111111111111111", "rita@example.com", "rita\\\\u0040example.com", "hunter2secret"):
        assert leaked not in exported, leaked
    assert sample["input"][1]["tool_calls"][0]["arguments"]["phone"] == "[REDACTED:phone]"


def test_redaction_keeps_json_that_holds_nothing_to_redact_as_it_was() -> None:
    r = Redactor()
    as_sent = '{ "seats" : 2,  "from": "SFO" }'
    assert r.value(as_sent) == as_sent  # nothing redacted: not rewritten
    assert r.value("[1] call me at rita@example.com") == "[1] call me at [REDACTED:email]"  # not JSON: as text
    assert r.value({"phone": 4155550123, "seats": 2, "ok": True}) == {
        "phone": "[REDACTED:phone]",
        "seats": 2,
        "ok": True,
    }
    deep = "[" * 5000 + "]" * 5000  # deeper than the walk goes: redacted as text, never an error
    assert r.value(deep) == deep
    assert r.text("rita@example.com", context="email: ") == "[REDACTED:email]"


def test_one_odd_conversation_never_makes_the_whole_file_unloadable(app, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Three conversations, each of which made a whole exported file fail to load: U+2028 in a string
    (written raw, it split the verifiers loader's lines), a tool result naming no call (verifiers refused
    the file), and a failing turn that opens the conversation (an empty Inspect input: 'No input in
    dataset'). The first two load; the third is skipped and reported."""
    rt, client = app
    _ingest(app, _conv("sep\u2028id", intent="line\u2028sep\u2029para\x85next"))
    orphan = _conv("orphan")
    orphan["messages"] = [
        {"role": "user", "content": "look it up"},
        {"role": "tool", "content": "a result whose call was lost"},
        {"role": "assistant", "content": "done"},
    ]
    _ingest(app, orphan)
    _ingest(app, {**_conv("opens"), "messages": [{"role": "assistant", "content": "hello there"}]})
    _ingest(app, _conv("fine"))

    rows, r = _export(client, "verifiers")
    assert _ids(rows) == {"sep\u2028id", "orphan", "fine"} and r.headers["x-vigil-skipped"] == "1"
    assert b"\xe2\x80\xa8" not in r.content and len(r.content.decode().splitlines()) == 3
    path = tmp_path / "rows.jsonl"
    path.write_bytes(r.content)
    from vigil.export.harness.verifiers_env import VigilConfig, VigilTaskset

    taskset = VigilTaskset.__new__(VigilTaskset)
    taskset.config = VigilConfig(path=str(path))
    tasks = taskset.load()
    assert len(tasks) == 3

    rows, r = _export(client, "inspect")
    path = tmp_path / "samples.jsonl"
    path.write_bytes(r.content)
    from inspect_ai.dataset import json_dataset

    samples = json_dataset(str(path))
    assert {s.metadata["source"]["conversation_id"] for s in samples} == {"sep\u2028id", "orphan", "fine"}

    from vigil.export.run import export

    with rt.sessions.begin() as s:
        result = export(s, {}, Redactor(), "native")
    assert "opens with it" in result.skipped["opens"]


def test_invisible_and_compatibility_characters_do_not_hide_personal_data(app) -> None:  # type: ignore[no-untyped-def]
    """A zero-width space, a soft hyphen, a no-break space or full-width digits inside an email or a card
    number read as the plain value to anyone who gets the file, but hid it from every detector: each of
    these survived the export whole. The detectors read a folded copy; the original characters go."""
    hidden = [
        "jane.doe@exam\u200bple.com",
        "rita@exam\u00adple.org",
        "4111\u00a01111\u00a01111\u00a01111",
        "4111\u200b1111\u200b1111\u200b1111",
        "\uff14\uff11\uff11\uff11 \uff11\uff11\uff11\uff11 \uff11\uff11\uff11\uff11 \uff11\uff11\uff11\uff11",
        "415\u2011555\u20110123",
    ]
    text = "on file: " + "; ".join(hidden)
    arguments = json.dumps({"note": text}, ensure_ascii=False)
    _ingest(
        app,
        {
            **_conv("hidden-pii"),
            "messages": [
                {"role": "user", "content": text},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "note", "arguments": arguments}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                {"role": "assistant", "content": "done"},
            ],
        },
    )
    _, client = app
    for fmt in FORMATS:
        [row], _ = _export(client, fmt)
        exported = json.dumps(row, ensure_ascii=False)
        for value in hidden:
            assert value not in exported, (fmt, value)
        assert exported.count("[REDACTED:card]") == 2 * 3 and exported.count("[REDACTED:email]") == 2 * 2, fmt
    r = Redactor()
    assert r.text("write to jane\u200b@example.com now") == "write to [REDACTED:email] now"
    # a dash as punctuation is no separator: the number beside it is still found
    assert (
        r.text("the number I gave\u2014555-123-2002\u2014abroad")
        == "the number I gave\u2014[REDACTED:phone]\u2014abroad"
    )
    plain = "caf\u00e9 \u4e2d\u6587 \u00e9t\u00e9 1\u00a0000 \u20ac"
    assert r.text(plain) == plain  # folded for the detectors, never rewritten where nothing is redacted


def test_personal_data_in_json_keys_is_redacted(app) -> None:  # type: ignore[no-untyped-def]
    """Keys were left as they are, so a tool result keyed by its customers' emails or phone numbers, or
    an argument named by a card number, left Vigil whole in every format. Keys are redacted like values;
    two keys redacted alike stay two, and a tool's ``required`` still names its redacted properties."""
    result = json.dumps(
        {"jane@example.com": {"tier": "gold"}, "rita@example.org": {"tier": "silver"}, "+1 415 555 0123": "mobile"}
    )
    arguments = json.dumps({"4111111111111111": "primary", "seats": 2})
    _ingest(
        app,
        {
            **_conv("keyed-pii"),
            "metadata": {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "pay",
                            "parameters": {
                                "type": "object",
                                "properties": {"4111111111111111": {"type": "string"}, "seats": {"type": "integer"}},
                                "required": ["4111111111111111"],
                            },
                        },
                    }
                ]
            },
            "messages": [
                {"role": "user", "content": "who is in the gold tier?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "pay", "arguments": arguments}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": result},
                {"role": "assistant", "content": "done"},
            ],
        },
    )
    _, client = app
    for fmt in FORMATS:
        [row], _ = _export(client, fmt)
        exported = json.dumps(row)
        for leaked in ("jane@example.com", "rita@example.org", "415 555 0123", "4111111111111111"):
            assert leaked not in exported, (fmt, leaked)
    [task], _ = _export(client, "native")
    assert json.loads(task["messages"][2]["content"]) == {
        "[REDACTED:email]": {"tier": "gold"},
        "[REDACTED:email] 2": {"tier": "silver"},
        "[REDACTED:phone]": "mobile",
    }
    assert json.loads(task["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {
        "[REDACTED:card]": "primary",
        "seats": 2,
    }
    [sample], _ = _export(client, "inspect")
    [tool] = sample["metadata"]["tools"]
    assert tool["parameters"]["required"] == ["[REDACTED:card]"]
    assert set(tool["parameters"]["properties"]) == {"[REDACTED:card]", "seats"}


def test_a_phone_number_that_opens_a_text_is_redacted(app) -> None:  # type: ignore[no-untyped-def]
    """A phone number with nothing before it (a message that opens with it, a tool result that is the
    number) was never detected: the check that the number does not continue a '+' or '-' before it read
    the empty string as one. Such a number left Vigil in every format; the pii_leak rule missed it too."""
    _ingest(
        app,
        {
            **_conv("opening-phone"),
            "messages": [
                {"role": "user", "content": "415-555-0123 is my cell, call me"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "+1 650 555 0199"},
                {"role": "assistant", "content": "done"},
            ],
        },
    )
    _, client = app
    for fmt in FORMATS:
        [row], _ = _export(client, fmt)
        exported = json.dumps(row)
        assert "415-555-0123" not in exported and "650 555 0199" not in exported, fmt
        assert exported.count("[REDACTED:phone]") == 2, fmt
