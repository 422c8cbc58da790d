"""Personal names leave Vigil redacted: the names a conversation states as data (a profile's first and last
name, a passenger list, a lookup by name) are redacted wherever they occur in its exported task, whole
and each part, in any case, with or without accents or invisible characters. Before, no detector found a
name: every full name of the real τ² conversations survived export."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from bench.name_redaction import stated_names
from tests.support.app import ADMIN, INGEST, make_client, make_settings
from tests.support.services import shared_data
from vigil.app.runtime import build_runtime
from vigil.export.names import MAX_NAME_CHARS, Names, stated
from vigil.export.redact import Redactor, redact_task
from vigil.ingest.importers import load_file
from vigil.settings import PROJECT_ROOT
from vigil.store.models import ConversationRow, ReviewLabelRow

NAME = "[REDACTED:name]"
TAU2 = (
    "sierra_gpt-4.1_airline_default_gpt-4.1_1trials.json",
    "sierra_gpt-4.1_retail_defautl_gpt-4.1_1trials.json",
    "sierra_gpt-4.1_telecom_default_gpt-4.1_1trials.json",
)


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"c-{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


PROFILE = {
    "user_id": "zoe_okafor_1234",
    "name": {"first_name": "Zoë", "last_name": "Okafor"},
    "email": "z.okafor@example.com",
    "orders": [{"items": [{"name": "Desk Lamp", "price": 30}]}],
    "plan": {"name": "Premium Plan"},
}
CONVERSATION = {
    "conversation_id": "names-1",
    "agent_id": "shop",
    "agent_version": "1",
    "metadata": {"goal": "You are Zoe Okafor; your flight to MIA was cancelled."},
    "messages": [
        {"role": "user", "content": "Hi, I'm Zoe Oka\u200bfor. My husband Tomasz booked us both to MIA."},
        {"role": "assistant", "tool_calls": [_call("find_user", {"first_name": "Zoë", "last_name": "Okafor"})]},
        {"role": "tool", "tool_call_id": "c-find_user", "content": json.dumps(PROFILE)},
        {"role": "tool", "tool_call_id": "c-x", "content": json.dumps({"Okafor": {"balance": 3}})},
        {"role": "assistant", "content": "Thanks, ZOË OKAFOR! I see a Desk Lamp on order a while ago."},
        {"role": "user", "content": "Yes, that's right, and the Premium Plan."},
        {"role": "assistant", "content": "Ms okafor, write to ops@internal.example about it."},  # leaks: fails here
        {"role": "assistant", "tool_calls": [_call("get_booking", {"booking_id": "B1"})]},
        {
            "role": "tool",
            "tool_call_id": "c-get_booking",
            "content": json.dumps({"passengers": [{"first_name": "Tomasz", "last_name": "Wiśniewski"}]}),
        },
        {"role": "assistant", "content": "Done."},
    ],
}


@pytest.fixture
def app(sqlite_url: str) -> Iterator[tuple[Any, Any]]:
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    with make_client(rt) as client:
        yield rt, client
    rt.close()


def _confirm(rt: Any, cid: str, notes: str | None = None) -> None:
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
                notes=notes,
            )
        )


def _export(client: Any) -> list[dict[str, Any]]:
    r = client.post("/v1/exports", params={"all": "true"}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return [orjson.loads(line) for line in r.content.splitlines() if line.strip()]


def test_names_a_conversation_states_are_redacted_everywhere_in_its_task(app: tuple[Any, Any]) -> None:
    rt, client = app
    r = client.post("/v1/conversations", json=CONVERSATION, headers=INGEST)
    assert r.status_code in (200, 202), r.text
    _confirm(rt, "names-1", notes="Told Zoe Okafor to write to an internal address.")
    [task] = _export(client)
    assert task["failure"]["message_index"] == 6
    text = json.dumps(task, ensure_ascii=False)
    # whole, each part, any case, accents or not, across an invisible character; in the goal, the messages,
    # tool arguments and results (JSON values and keys), the failed turn and the reviewer's notes
    for name in ("Zoë", "Zoe", "Okafor", "OKAFOR", "okafor", "Oka\u200bfor", "Oka\\u200bfor", "Tomasz"):
        assert not re.search(rf"(?<![^\W_]){re.escape(name)}(?![^\W_])", text, re.I), name
    assert task["goal"] == f"You are {NAME}; your flight to MIA was cancelled."
    assert task["messages"][0]["content"] == f"Hi, I'm {NAME}. My husband {NAME} booked us both to MIA."
    args = json.loads(task["messages"][1]["tool_calls"][0]["function"]["arguments"])
    assert args == {"first_name": NAME, "last_name": NAME}
    profile = json.loads(task["messages"][2]["content"])
    assert profile["name"] == {"first_name": NAME, "last_name": NAME}
    assert profile["user_id"] == f"{NAME}_1234"  # the name inside the user id too
    assert json.loads(task["messages"][3]["content"]) == {NAME: {"balance": 3}}
    assert task["messages"][4]["content"] == f"Thanks, {NAME}! I see a Desk Lamp on order a while ago."
    assert "ZOË" not in text
    assert task["failure"]["failed_turn"]["content"].startswith(f"Ms {NAME}, write to [REDACTED:email]")
    assert task["review"]["notes"] == [f"Told {NAME} to write to an internal address."]
    # what is not a person's name is kept: a product's and a plan's name, an airport code, words
    assert profile["orders"][0]["items"][0]["name"] == "Desk Lamp" and profile["plan"]["name"] == "Premium Plan"
    assert task["messages"][5]["content"] == "Yes, that's right, and the Premium Plan."


def test_name_redaction_can_be_turned_off_and_told_more_keys(sqlite_url: str) -> None:
    task = {"messages": [{"role": "tool", "content": json.dumps({"agent_name": "Priya Raman"})}]}
    off = Redactor(redact_names=False)
    assert redact_task(off, task) == task
    assert redact_task(Redactor(), task) == task  # agent_name is no built-in name key
    more = Redactor(name_keys=["agentName"])
    assert json.loads(redact_task(more, task)["messages"][0]["content"]) == {"agent_name": NAME}
    assert more.counts["name"] == 1
    settings = make_settings(sqlite_url, export_redact_names=False, export_redact_name_keys=["agent_name"])
    assert Redactor.of(settings).stated_names(task) == set()


@pytest.mark.parametrize(
    ("value", "text", "kept"),
    [
        ("A", "A cat and a dog.", "A cat and a dog."),  # one letter: never a part on its own
        ("The", "The cat and the dog.", "The cat and the dog."),  # a common word
        ("a.*b+", "a.*b+ and aaab", "a.*b+ and aaab"),  # a pattern is text, and its words are one letter
        ("(x|x)*y", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxy", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxy"),
        ("Li", "li and LI are not Li.", f"li and LI are not {NAME}."),  # two letters: only capitalised
        ("Mia", "Fly MIA to LAX, Mia.", f"Fly MIA to LAX, {NAME}."),  # MIA: an airport code
        ("x" * (MAX_NAME_CHARS + 1), "x" * (MAX_NAME_CHARS + 1), "x" * (MAX_NAME_CHARS + 1)),
        ("Ann Lee", "Dear Ann  Lee, Lee-Ann, ann_lee_7", f"Dear {NAME}, {NAME}-{NAME}, {NAME}_7"),
        ("Ann Lee", "Ann\nLee", f"{NAME}\n{NAME}"),  # two lines: two parts
    ],
)
def test_hostile_names_redact_only_themselves(value: str, text: str, kept: str) -> None:
    redactor = Redactor().with_names([value])
    assert redactor.text(text) == kept


def test_a_huge_name_value_is_no_name_and_a_long_text_is_read_once() -> None:
    huge = "Zed " * 100_000
    assert stated({"first_name": huge, "last_name": "Quill"}) >= {huge, "Quill"}
    names = Names([huge, "Quill"])
    assert names.parts == {"quill"} and not names.whole
    text = "Quill " * 50_000
    assert len(list(names.find(text))) == 50_000


def test_no_full_name_of_the_real_tau2_conversations_survives_export(sqlite_url: str) -> None:
    """Every τ² domain states its user's name as data: airline and retail profiles' first and last names,
    booked passengers, retail's lookup by name and zip code, telecom's customer full_name. Before, every
    full name in an exported task survived (88 of 88); now none does, and nothing but names is redacted
    as one (a product's or a plan's name, an airport code such as MIA beside a passenger named Mia)."""
    paths = [shared_data("tau2", "trajectories", name) for name in TAU2]
    convs = [c for p in paths for c in load_file(p, "auto", None, None)]
    truth = {sim["id"]: stated_names(sim) for p in paths for sim in json.loads(p.read_text())["simulations"]}
    rt = build_runtime(
        make_settings(sqlite_url, rule_packs=str(PROJECT_ROOT / "rules" / "*.yaml")), registry=CollectorRegistry()
    )
    with make_client(rt) as client:
        rt.pipeline.process(convs, "test")
        for c in convs:
            _confirm(rt, c.conversation_id)
        tasks = _export(client)
    rt.close()
    originals = {c.conversation_id: c for c in convs}
    present = surviving = 0
    for t in tasks:
        conv = originals[t["source"]["conversation_id"]]
        before = json.dumps([m.model_dump(mode="json") for m in conv.messages[: t["failure"]["message_index"] + 1]])
        after = json.dumps(t, ensure_ascii=False)
        for name in truth[conv.conversation_id.rsplit(":", 1)[-1]]:
            if re.search(rf"\b{re.escape(name)}\b", before, re.I):
                present += 1
                surviving += bool(re.search(rf"\b{re.escape(name)}\b", after, re.I))
        assert "Premium Plan" not in before or "Premium Plan" in after
        assert not re.search(r"\bMIA\b", before) or re.search(r"\bMIA\b", after)
    assert present >= 80 and surviving == 0, (present, surviving)
    assert sum(json.dumps(t).count(NAME) for t in tasks) > present
    assert any("Desk Lamp" in json.dumps(t) for t in tasks)
