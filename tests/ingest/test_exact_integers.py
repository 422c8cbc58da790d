"""Integers beyond 64 bits reach the rules exactly (not as the nearest double) on every way in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import INGEST, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.ingest.decode import decode_batch, decode_document
from vigil.ingest.pipeline import Envelope
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.runtime import Runtime
from vigil.schema import Conversation, loads_exact
from vigil.store.models import ConversationRow, FindingRow

WIDE = 2**70 + 1  # the nearest double is 2**70: a lossy read compares equal to 2**70, not to WIDE
LIMIT = 1_000_000
PACK = f"""
pack: wide
rules:
  - id: wide-transfer
    type: forbidden_tool
    severity: high
    args:
      tools: [transfer]
      when_args: {{arg: amount, values: [{WIDE}]}}
"""


def conversation(cid: str, n: int, as_text: bool = True) -> dict[str, Any]:
    base = next(iter(Simulator(parse_versions("v1:0.0"), 3).stream(1)))
    args: Any = {"amount": n, "ids": [-(2**63) - 1, 2**64 - 1]}
    call = {"id": "t1", "function": {"name": "transfer", "arguments": json.dumps(args) if as_text else args}}
    messages = [*base["messages"], {"role": "assistant", "tool_calls": [call]}]
    return dict(base, conversation_id=cid, messages=messages, metadata={"n": n, "note": "id 1234567890123456789"})


def raw(conv: dict[str, Any]) -> bytes:
    return json.dumps(conv).encode()  # orjson cannot write integers beyond 64 bits


def check_exact(conv: Conversation, n: int) -> None:
    assert conv.metadata["n"] == n and type(conv.metadata["n"]) is int
    args = conv.messages[-1].tool_calls[0].args  # type: ignore[index]
    assert args == {"amount": n, "ids": [-(2**63) - 1, 2**64 - 1]}
    assert all(type(v) is int for v in [args["amount"], *args["ids"]])


def test_loads_exact_keeps_every_integer_and_the_strict_grammar() -> None:
    assert loads_exact(b"[1180591620717411303425, -9223372036854775809, 18446744073709551615, 1.5]") == [
        WIDE,
        -(2**63) - 1,
        2**64 - 1,
        1.5,
    ]
    assert loads_exact('{"a": "12345678901234567890", "b": 1e300}') == {"a": "12345678901234567890", "b": 1e300}
    for refused in (b"[NaN]", b'["\\ud800"]', b"[1" + b"0" * 400 + b"]", b"[1] x"):
        with pytest.raises(ValueError):
            loads_exact(refused)


def test_long_digit_runs_inside_strings_are_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace or order id of 20+ decimal digits in a string sent every such document through Python's
    parser a second time (a regular expression scan, then ``json.loads``: about 1 ms for a 30 kB document
    against 0.2 ms); only a double of 2**63 or more in the fast parse now means an integer was rounded."""
    import vigil.schema as schema

    def second_parse(*_: Any, **__: Any) -> Any:
        raise AssertionError("read a second time")

    doc = b'{"trace_ids": ["00000000000000000000000003938713"], "id": "-1234567890123456789", "n": [1.5, 42]}'
    monkeypatch.setattr(schema.json, "loads", second_parse)
    assert loads_exact(doc)["trace_ids"] == ["00000000000000000000000003938713"]
    with pytest.raises(AssertionError, match="read a second time"):  # an integer orjson rounds still is
        loads_exact(b'{"id": "00000000000000000000000003938713", "n": 1180591620717411303425}')


@pytest.mark.parametrize("as_text", [True, False])
def test_the_decoder_keeps_wide_integers_exact(as_text: bool) -> None:
    conv = conversation("c1", WIDE, as_text)
    got, stored = decode_document(raw(conv), LIMIT)
    check_exact(got, WIDE)
    assert json.loads(stored) == conv
    body = raw(conv) if as_text else json.dumps([conv, dict(conv, conversation_id="c2")]).encode()
    batch = decode_batch(body, LIMIT, 10)
    assert [i.error for i in batch.items] == [None] * len(batch.items)
    for item in batch.items:
        assert item.conversation is not None
        check_exact(item.conversation, WIDE)
        assert json.loads(item.raw)["metadata"]["n"] == WIDE


def wide_runtime(url: str, tmp_path: Path) -> tuple[Runtime, list[Conversation]]:
    pack = tmp_path / "wide.yaml"
    pack.write_text(PACK)
    rt = build_runtime(make_settings(url, rule_packs=str(pack)), registry=CollectorRegistry())
    seen: list[Conversation] = []
    evaluate = rt.pipeline.rules.evaluate

    def recording(c: Conversation) -> Any:
        seen.append(c)
        return evaluate(c)

    rt.pipeline.rules.evaluate = recording  # type: ignore[method-assign]
    return rt, seen


def check_stored(rt: Runtime) -> None:
    with rt.sessions() as s:
        docs = dict(s.execute(select(ConversationRow.conversation_id, ConversationRow.document)).all())
        fired = set(s.scalars(select(FindingRow.conversation_id).where(FindingRow.rule_id == "wide-transfer")))
    assert json.loads(docs["wide"])["metadata"]["n"] == WIDE and json.loads(docs["near"])["metadata"]["n"] == 2**70
    assert fired == {"wide"}  # a lossy read would fire on "near" (2**70) and not on "wide"


def test_http_rules_see_wide_integers_exactly(db_url: str, tmp_path: Path) -> None:
    rt, seen = wide_runtime(db_url, tmp_path)
    with make_client(rt) as c:
        for cid, n in (("wide", WIDE), ("near", 2**70)):
            r = c.post("/v1/conversations", content=raw(conversation(cid, n)), headers=INGEST)
            assert r.status_code == 202, r.text
    check_stored(rt)
    check_exact(next(c for c in seen if c.conversation_id == "wide"), WIDE)
    rt.close()


def test_kafka_records_keep_wide_integers_exact(db_url: str, tmp_path: Path) -> None:
    rt, seen = wide_runtime(db_url, tmp_path)
    envs = [
        Envelope(raw(conversation(cid, n)), "kafka", "conversations", 0, i, cid)
        for i, (cid, n) in enumerate((("wide", WIDE), ("near", 2**70)))
    ]
    result = rt.pipeline.process_raw(envs)
    assert len(result.stored) == 2 and not result.dead_letters
    check_stored(rt)
    check_exact(next(c for c in seen if c.conversation_id == "wide"), WIDE)
    rt.close()


PLUGIN = '''
from vigil.rules import ConversationView, Hit, RuleArgs, rule_type


@rule_type("echo_wide", RuleArgs)
def echo_wide(view: ConversationView, args: RuleArgs):
    """Puts the metadata's n in a finding's details, as a rule of an operator's plugin may."""
    yield Hit("n seen", [], {"n": view.conversation.metadata.get("n")})
'''


def test_a_finding_may_carry_a_wide_integer_in_its_details(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "vigil_test_echo_wide"  # imported once per session: its rule type registers once
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    pack = tmp_path / "echo.yaml"
    pack.write_text("pack: echo\nrules:\n  - id: echo-wide\n    type: echo_wide\n    severity: low\n")
    rt = build_runtime(make_settings(db_url, rule_packs=str(pack), rule_plugins=module), registry=CollectorRegistry())
    try:
        result = rt.pipeline.process_raw([Envelope(raw(conversation("wide", WIDE)), "kafka", "t", 0, 0, "wide")])
        assert len(result.stored) == 1 and not result.dead_letters
        with rt.sessions() as s:
            details = s.scalars(select(FindingRow.details).where(FindingRow.rule_id == "echo-wide")).all()
        assert [float(d["n"]) for d in details] == [float(WIDE)]
    finally:
        rt.close()
