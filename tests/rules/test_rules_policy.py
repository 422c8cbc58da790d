"""The policy rule types (per-entity limits, one customer, values from a lookup, say-before, refused
writes, unresolved at the end) on small conversations and on the real τ² runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.services import shared_data
from vigil.ingest.importers import load_file
from vigil.rules import RuleEngine
from vigil.rules.builtin_policy import (
    ArgFromLookupArgs,
    PerEntityLimitArgs,
    SayBeforeArgs,
    SingleEntityArgs,
    UnresolvedAtEndArgs,
    WriteRefusedArgs,
    arg_from_lookup,
    per_entity_limit,
    say_before,
    single_entity,
    unresolved_at_end,
    write_refused,
)
from vigil.rules.view import ConversationView
from vigil.schema import Conversation
from vigil.settings import PROJECT_ROOT


def _view(*steps: tuple[str, Any]) -> ConversationView:
    """steps: ("user"/"assistant", text) or ("call", (name, args, result_text, is_error))."""
    messages: list[dict[str, Any]] = []
    for n, (kind, value) in enumerate(steps):
        if kind == "call":
            name, args, result, error = value
            messages.append(
                {
                    "role": "assistant",
                    "tool_calls": [{"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": args}}],
                }
            )
            messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": result, "is_error": error})
        else:
            messages.append({"role": kind, "content": value})
    conv = Conversation.model_validate(
        {"conversation_id": "c", "agent_id": "a", "agent_version": "v", "messages": messages}
    )
    return ConversationView(conv)


def test_per_entity_limit_counts_only_calls_that_went_through() -> None:
    args = PerEntityLimitArgs(tools=["modify_items"], key="order_id", then_forbidden=["cancel"])
    refused_then_ok = _view(
        ("call", ("modify_items", {"order_id": "1"}, "Error: lengths differ", True)),
        ("call", ("modify_items", {"order_id": "1"}, "{}", False)),
    )
    assert list(per_entity_limit(refused_then_ok, args)) == []
    twice = _view(
        ("call", ("modify_items", {"order_id": "1"}, "{}", False)),
        ("call", ("modify_items", {"order_id": "2"}, "{}", False)),
        ("call", ("modify_items", {"order_id": "1"}, "{}", False)),
        ("call", ("cancel", {"order_id": "1"}, "{}", False)),
    )
    hits = list(per_entity_limit(twice, args))
    assert [h.details["tool"] for h in hits] == ["modify_items", "cancel"]


def test_single_entity_and_arg_from_lookup() -> None:
    two_users = _view(
        ("call", ("get_user", {"user_id": "u1"}, "{}", False)), ("call", ("get_user", {"user_id": "u2"}, "{}", False))
    )
    assert len(list(single_entity(two_users, SingleEntityArgs(key="user_id")))) == 1
    order = '{"payment_history": [{"payment_method_id": "credit_card_1"}]}'
    args = ArgFromLookupArgs(
        tools=["return"],
        arg="payment_method_id",
        lookup=["get_order"],
        join_on="order_id",
        also_allowed_prefixes=["gift_card_"],
    )
    ok = _view(
        ("call", ("get_order", {"order_id": "1"}, order, False)),
        ("call", ("return", {"order_id": "1", "payment_method_id": "credit_card_1"}, "{}", False)),
        ("call", ("return", {"order_id": "1", "payment_method_id": "gift_card_9"}, "{}", False)),
    )
    assert list(arg_from_lookup(ok, args)) == []
    bad = _view(
        ("call", ("get_order", {"order_id": "1"}, order, False)),
        ("call", ("return", {"order_id": "1", "payment_method_id": "paypal_7"}, "{}", False)),
    )
    assert "paypal_7" in next(iter(arg_from_lookup(bad, args))).message


def test_say_before_write_refused_and_unresolved_at_end() -> None:
    say = SayBeforeArgs(tools=["modify_items"], phrases=["all the items"])
    reminded = _view(("assistant", "Have you listed all the items?"), ("call", ("modify_items", {}, "{}", False)))
    silent = _view(("assistant", "Doing it."), ("call", ("modify_items", {}, "{}", False)))
    assert list(say_before(reminded, say)) == [] and len(list(say_before(silent, say))) == 1
    refused = _view(
        ("call", ("cancel", {}, "Error: order is not pending", False)), ("call", ("get", {}, "Error: x", False))
    )
    assert [h.details["tool"] for h in write_refused(refused, WriteRefusedArgs(tools=["cancel"]))] == ["cancel"]
    un = UnresolvedAtEndArgs(tools=["speed_test"], unresolved=["no connection"])
    fixed = _view(
        ("call", ("speed_test", {}, "Speed test failed: No Connection.", False)),
        ("call", ("speed_test", {}, "275 Mbps (Excellent)", False)),
    )
    broken = _view(
        ("call", ("speed_test", {}, "275 Mbps (Excellent)", False)),
        ("call", ("speed_test", {}, "Speed test failed: No Connection.", False)),
    )
    assert list(unresolved_at_end(fixed, un)) == [] and len(list(unresolved_at_end(broken, un))) == 1


def test_telecom_unresolved_at_end_on_real_runs() -> None:
    """The workflow's own verification, on the real gpt-4.1 telecom run: it never fires on a success."""
    engine = RuleEngine.from_paths([PROJECT_ROOT / "rules" / "tau2_telecom.yaml"])
    path = shared_data("tau2", "trajectories", "sierra_gpt-4.1_telecom_default_gpt-4.1_1trials.json")
    fired = {True: 0, False: 0}
    for conv in load_file(Path(path)):
        if any(f.rule_id == "telecom-unresolved-at-end" for f in engine.evaluate(conv)):
            fired[conv.outcomes[0].value < 1] += 1
    assert fired[False] == 0 and fired[True] >= 15
