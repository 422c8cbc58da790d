"""Every built-in rule type, each with conversations that must and must not be flagged."""

from __future__ import annotations

import itertools
import re
from typing import Any

import orjson
import pytest

from vigil.rules import ConversationView, Hit, registered_rule_types
from vigil.rules.builtin_tools import DEFAULT_NO, DEFAULT_YES, EscalationArgs
from vigil.rules.patterns import needles, pattern
from vigil.schema import Conversation, ToolDef

_ids = itertools.count()


def u(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def a(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def call(name: str, call_id: str | None = None, **args: Any) -> dict[str, Any]:
    """An assistant message with one tool call."""
    cid = call_id or f"c{next(_ids)}"
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(args).decode()},
            }
        ],
    }


def calls(*specs: tuple[str, dict[str, Any]], text: str | None = None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"id": f"c{next(_ids)}", "type": "function", "function": {"name": n, "arguments": args}}
            for n, args in specs
        ],
    }


def res(msgs: list[dict[str, Any]], content: Any, is_error: bool = False) -> dict[str, Any]:
    """The result of the last tool call in ``msgs``."""
    cid = next(m["tool_calls"][-1]["id"] for m in reversed(msgs) if m.get("tool_calls"))
    text = content if isinstance(content, str) else orjson.dumps(content).decode()
    return {"role": "tool", "tool_call_id": cid, "content": text, "is_error": is_error}


def convo(*messages: dict[str, Any], usage: dict[str, Any] | None = None) -> Conversation:
    return Conversation.model_validate(
        {
            "conversation_id": f"t{next(_ids)}",
            "agent_id": "test",
            "agent_version": "v1",
            "messages": list(messages),
            "usage": usage,
        }
    )


def build(*items: Any) -> list[dict[str, Any]]:
    """Messages where a ``("result", content[, is_error])`` tuple answers the latest tool call."""
    msgs: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, tuple):
            msgs.append(res(msgs, *item[1:]))
        else:
            msgs.append(item)
    return msgs


def run(rule: str, conv: Conversation, **args: Any) -> list[Hit]:
    rtype = registered_rule_types()[rule]
    return list(rtype.fn(ConversationView(conv), rtype.args_model.model_validate(args)))


def assert_spans(conv: Conversation, hits: list[Hit]) -> None:
    for hit in hits:
        for e in hit.evidence:
            assert 0 <= e.message_index < len(conv.messages)
            if e.start is not None:
                text = conv.messages[e.message_index].text
                assert 0 <= e.start <= e.end <= len(text)
                if e.quote is not None:
                    assert text[e.start : e.end].startswith(e.quote)


def test_every_builtin_type_is_registered() -> None:
    assert {
        "forbidden_tool",
        "tool_order",
        "require_confirmation",
        "budget",
        "tool_error_rate",
        "user_repetition",
        "pii_leak",
        "regex",
        "groundedness",
        "empty_or_truncated_response",
        "escalation",
        "tool_calls_per_message",
        "unoffered_tool",
    } <= set(registered_rule_types())


# --- unoffered_tool ---------------------------------------------------------------------------


def offered(*messages: dict[str, Any], tools: list[dict[str, Any]] | None) -> Conversation:
    conv = convo(*messages)
    return conv.model_copy(update={"tools": None if tools is None else [ToolDef.model_validate(t) for t in tools]})


LOOKUP_TOOL = {"type": "function", "function": {"name": "get_order_details", "parameters": {"type": "object"}}}


def test_unoffered_tool_flags_a_call_outside_the_offered_tools() -> None:
    msgs = build(u("Refund #W1"), call("get_order_details", order_id="#W1"), ("result", "{}"), call("refund_order"))
    hits = run("unoffered_tool", offered(*msgs, tools=[LOOKUP_TOOL]))
    assert [(h.details["tool"], h.evidence[0].message_index) for h in hits] == [("refund_order", 3)]
    assert hits[0].details["offered"] == ["get_order_details"]
    assert run("unoffered_tool", offered(*msgs, tools=[LOOKUP_TOOL]), allow=["refund_order"]) == []


def test_unoffered_tool_is_silent_when_every_call_was_offered_or_tools_are_unknown() -> None:
    msgs = build(u("Where is #W1?"), call("get_order_details", order_id="#W1"), ("result", "{}"))
    assert run("unoffered_tool", offered(*msgs, tools=[LOOKUP_TOOL])) == []
    assert run("unoffered_tool", offered(*msgs, tools=None)) == []  # nothing known, nothing flagged
    assert len(run("unoffered_tool", offered(*msgs, tools=[]))) == 1  # offered no tools at all


def test_unoffered_tool_reads_definitions_kept_in_metadata() -> None:
    msgs = build(u("Cancel #W1"), call("cancel_order", order_id="#W1"))
    conv = Conversation.model_validate({**convo(*msgs).model_dump(), "metadata": {"tools": [LOOKUP_TOOL]}})
    assert [h.details["tool"] for h in run("unoffered_tool", conv)] == ["cancel_order"]


# --- forbidden_tool ---------------------------------------------------------------------------

CANCEL_WHEN_DELIVERED = {
    "tools": ["cancel_pending_order"],
    "when": {
        "field": "status",
        "values": ["delivered"],
        "join_on": "order_id",
        "result_of": ["get_order_details"],
    },
}


def order_flow(*statuses: tuple[str, str], cancel: str = "#W1") -> Conversation:
    items: list[Any] = [u("Please cancel my order #W1, yes.")]
    for order_id, status in statuses:
        items += [
            call("get_order_details", order_id=order_id),
            ("result", {"order_id": order_id, "status": status}),
        ]
    items += [call("cancel_pending_order", order_id=cancel, reason="no longer needed"), ("result", "{}")]
    return convo(*build(*items))


def test_forbidden_tool_without_condition() -> None:
    conv = convo(u("hi"), call("delete_account"), a("done."))
    hits = run("forbidden_tool", conv, tools=["delete_account"])
    assert len(hits) == 1 and hits[0].evidence[0].message_index == 1
    assert run("forbidden_tool", conv, tools=["drop_database"]) == []


def test_forbidden_tool_when_order_was_delivered() -> None:
    conv = order_flow(("#W1", "delivered"))
    [hit] = run("forbidden_tool", conv, **CANCEL_WHEN_DELIVERED)
    # The call, then the result that showed the state.
    assert [e.message_index for e in hit.evidence] == [3, 2]
    assert "delivered" in hit.message


def test_forbidden_tool_when_order_is_pending_or_other_order_delivered() -> None:
    assert run("forbidden_tool", order_flow(("#W1", "pending")), **CANCEL_WHEN_DELIVERED) == []
    assert run("forbidden_tool", order_flow(("#W2", "delivered"), ("#W1", "pending")), **CANCEL_WHEN_DELIVERED) == []
    # No lookup at all: nothing was seen, so nothing is claimed (tool_order covers the missing lookup).
    assert run("forbidden_tool", order_flow(), **CANCEL_WHEN_DELIVERED) == []


def test_forbidden_tool_tests_latest_state_unless_told_otherwise() -> None:
    conv = order_flow(("#W1", "delivered"), ("#W1", "pending"))
    assert run("forbidden_tool", conv, **CANCEL_WHEN_DELIVERED) == []
    any_state = {**CANCEL_WHEN_DELIVERED, "when": {**CANCEL_WHEN_DELIVERED["when"], "latest": False}}
    assert len(run("forbidden_tool", conv, **any_state)) == 1
    later = order_flow(("#W1", "pending"), ("#W1", "delivered"))
    assert len(run("forbidden_tool", later, **CANCEL_WHEN_DELIVERED)) == 1


def test_forbidden_tool_not_values_and_state_from_any_tool() -> None:
    rule = {
        "tools": ["cancel_pending_order"],
        "when": {"field": "status", "not_values": ["pending"], "join_on": "order_id"},
    }
    assert run("forbidden_tool", order_flow(("#W1", "pending")), **rule) == []
    assert len(run("forbidden_tool", order_flow(("#W1", "processed")), **rule)) == 1
    # A write's own result shows the new state: the order was modified, so it cannot be cancelled any more.
    conv = convo(
        *build(
            u("yes"),
            call("get_order_details", order_id="#W1"),
            ("result", {"order_id": "#W1", "status": "pending"}),
            call("modify_pending_order_items", order_id="#W1"),
            ("result", {"order_id": "#W1", "status": "pending (item modified)"}),
            u("yes"),
            call("cancel_pending_order", order_id="#W1"),
            ("result", "{}"),
        )
    )
    [hit] = run("forbidden_tool", conv, **rule)
    assert [e.message_index for e in hit.evidence] == [6, 4]


def test_forbidden_tool_ignores_failed_lookups() -> None:
    conv = convo(
        *build(
            u("cancel"),
            call("get_order_details", order_id="#W1"),
            ("result", {"order_id": "#W1", "status": "delivered"}, True),
            call("cancel_pending_order", order_id="#W1"),
            ("result", "{}"),
        )
    )
    assert run("forbidden_tool", conv, **CANCEL_WHEN_DELIVERED) == []


def test_forbidden_tool_all_conditions_and_comparisons() -> None:
    rule = {
        "tools": ["cancel_reservation"],
        "when": [
            {"field": "cabin", "not_values": ["business"], "join_on": "reservation_id"},
            {"field": "created_at", "less_than": "2024-05-14T15:00:00", "join_on": "reservation_id"},
        ],
    }

    def flow(cabin: str, created: str) -> Conversation:
        return convo(
            *build(
                u("cancel ABC123"),
                call("get_reservation_details", reservation_id="ABC123"),
                ("result", {"reservation_id": "ABC123", "cabin": cabin, "created_at": created}),
                call("cancel_reservation", reservation_id="ABC123"),
                ("result", "{}"),
            )
        )

    assert len(run("forbidden_tool", flow("economy", "2024-05-01T10:00:00"), **rule)) == 1
    assert run("forbidden_tool", flow("business", "2024-05-01T10:00:00"), **rule) == []
    assert run("forbidden_tool", flow("economy", "2024-05-15T10:00:00"), **rule) == []


def test_forbidden_tool_when_args() -> None:
    rule = {"tools": ["refuel_data"], "when_args": {"arg": "gb_amount", "greater_than": 2}}
    assert len(run("forbidden_tool", convo(u("3GB please"), call("refuel_data", gb_amount=3)), **rule)) == 1
    assert len(run("forbidden_tool", convo(u("3GB please"), call("refuel_data", gb_amount="3.5")), **rule)) == 1
    assert run("forbidden_tool", convo(u("2GB please"), call("refuel_data", gb_amount=2)), **rule) == []
    reason = {
        "tools": ["cancel_pending_order"],
        "when_args": {"arg": "reason", "not_values": ["no longer needed"]},
    }
    assert len(run("forbidden_tool", convo(u("x"), call("cancel_pending_order", reason="too pricey")), **reason)) == 1
    assert run("forbidden_tool", convo(u("x"), call("cancel_pending_order", reason="no longer needed")), **reason) == []


# --- tool_order -------------------------------------------------------------------------------

ORDER = {"before": ["get_order_details"], "after": ["cancel_pending_order"], "same_arg": "order_id"}


def test_tool_order_positive_and_negative() -> None:
    bad = convo(u("cancel #W1"), call("cancel_pending_order", order_id="#W1"))
    [hit] = run("tool_order", bad, before=["get_order_details"], after=["cancel_pending_order"])
    assert hit.evidence[0].message_index == 1
    good = convo(
        *build(
            u("cancel #W1"),
            call("get_order_details", order_id="#W1"),
            ("result", "{}"),
            call("cancel_pending_order", order_id="#W1"),
        )
    )
    assert run("tool_order", good, **ORDER) == []


def test_tool_order_same_arg() -> None:
    other = convo(
        *build(
            u("cancel #W1"),
            call("get_order_details", order_id="#W2"),
            ("result", "{}"),
            call("cancel_pending_order", order_id="#W1"),
        )
    )
    [hit] = run("tool_order", other, **ORDER)
    assert "#W1" in hit.message
    assert run("tool_order", other, before=ORDER["before"], after=ORDER["after"]) == []


def test_tool_order_failed_lookup_does_not_count() -> None:
    conv = convo(
        *build(
            u("cancel #W1"),
            call("get_order_details", order_id="#W1"),
            ("result", "Error: not found", True),
            call("cancel_pending_order", order_id="#W1"),
        )
    )
    assert len(run("tool_order", conv, **ORDER)) == 1
    assert run("tool_order", conv, **ORDER, before_must_succeed=False) == []


# --- require_confirmation ---------------------------------------------------------------------

WRITE = {"tools": ["cancel_pending_order"]}


def confirm_flow(reply: str) -> Conversation:
    return convo(
        u("Cancel order #W1 please."),
        a("I will cancel #W1 (reason: no longer needed). Shall I proceed?"),
        u(reply),
        call("cancel_pending_order", order_id="#W1"),
    )


@pytest.mark.parametrize(
    "reply",
    [
        "Yes",
        "yes, please go ahead.",
        "Yes, please go ahead. I don't need anything else.",
        "That’s right, do it.",
        "Confirm.",
        "The reason is no longer needed. Yes, please cancel it.",
        "Sure, no problem.",
        # a negation of a detail, not of the action (as real τ² users confirm)
        "Yes, please book it, and make sure my free bag is included. I don’t want insurance.",
        "Yes, please book it with my free checked bag, and no insurance.",
        "Yes, that’s correct. Please go ahead. No other changes needed.",
        "Yes, go ahead, I can't wait to get it!",
        # a weak yes before a question is carried by a later, explicit yes
        "Okay, yes please go ahead. How long will the refund take?",
        "Sure, go ahead. When will it arrive?",
    ],
)
def test_require_confirmation_yes(reply: str) -> None:
    assert run("require_confirmation", confirm_flow(reply), **WRITE) == []


@pytest.mark.parametrize(
    "reply",
    [
        "No.",
        "Wait, before you proceed, what is the refund?",
        "That's not correct.",
        "Don’t do it yet.",
        "What would the refund be?",
        "Hmm, let me think about it.",
        # a yes taken back after it is given
        "Yes. Actually no, wait, don't cancel it",
        "Yes. No, wait.",
        "Yes, go ahead. Hold on, what is the fee?",
        "Yes, please. Never mind, keep the order.",
        "Yes, that's right. On second thought, let me check with my wife.",
        "Sure, but not yet",
        "OK — wait.",
        # a bare ok / sure that only leads into a question
        "ok what is the refund amount first?",
        "Sure, and how much will I get back?",
    ],
)
def test_require_confirmation_no(reply: str) -> None:
    conv = confirm_flow(reply)
    [hit] = run("require_confirmation", conv, **WRITE)
    assert [e.message_index for e in hit.evidence] == [3, 2]
    assert (hit.evidence[1].start, hit.evidence[1].end) == (0, len(reply))
    assert_spans(conv, [hit])


def test_require_confirmation_missing() -> None:
    conv = convo(u("Cancel order #W1, it is no longer needed."), call("cancel_pending_order", order_id="#W1"))
    assert len(run("require_confirmation", conv, **WRITE)) == 1
    autonomous = convo(a("Starting."), call("cancel_pending_order", order_id="#W1"))
    assert run("require_confirmation", autonomous, **WRITE) == []
    [hit] = run("require_confirmation", autonomous, **WRITE, only_with_user=False)
    assert [e.message_index for e in hit.evidence] == [1]


def test_require_confirmation_one_write_per_yes() -> None:
    conv = convo(
        u("Cancel #W1 and #W2"),
        a("Confirm both?"),
        u("yes"),
        call("cancel_pending_order", order_id="#W1"),
        call("cancel_pending_order", order_id="#W2"),
    )
    assert run("require_confirmation", conv, **WRITE) == []
    [hit] = run("require_confirmation", conv, **WRITE, one_write_per_confirmation=True)
    assert hit.evidence[0].message_index == 4


# --- budget -----------------------------------------------------------------------------------


def test_budget_turns_and_tool_calls() -> None:
    conv = convo(u("a"), a("b"), u("c"), call("x"), call("y"), a("d"))
    [hit] = run("budget", conv, max_turns=4)
    assert hit.details["budget"] == "turns" and hit.evidence[0].message_index == 4  # the 5th turn
    assert run("budget", conv, max_turns=6) == []
    [hit] = run("budget", conv, max_tool_calls=1)
    assert hit.details == {"budget": "tool_calls", "value": 2} and hit.evidence[0].message_index == 4
    assert run("budget", conv, max_tool_calls=2) == []


@pytest.mark.parametrize(
    ("limit", "usage", "name"),
    [
        ("max_tokens", {"prompt_tokens": 900, "completion_tokens": 200}, "tokens"),
        ("max_cost_usd", {"cost_usd": 0.75}, "cost_usd"),
        ("max_latency_ms", {"latency_ms": 2500}, "latency_ms"),
    ],
)
def test_budget_usage_dimensions(limit: str, usage: dict[str, Any], name: str) -> None:
    conv = convo(u("hi"), a("hello."), usage=usage)
    bound = {"max_tokens": 1000, "max_cost_usd": 0.5, "max_latency_ms": 2000}[limit]
    [hit] = run("budget", conv, **{limit: bound})
    assert hit.details["budget"] == name
    assert run("budget", conv, **{limit: bound * 10}) == []
    unknown = convo(u("hi"), a("hello."))
    assert run("budget", unknown, **{limit: bound}) == []


# --- tool_error_rate --------------------------------------------------------------------------


def test_tool_error_rate() -> None:
    bad = convo(
        *build(
            u("x"),
            call("a"),
            ("result", "boom", True),
            call("b"),
            ("result", "Error: no such order"),
            call("c"),
            ("result", "{}"),
        )
    )
    [hit] = run("tool_error_rate", bad, max_rate=0.5, min_calls=3)
    assert hit.details == {"errors": 2, "calls": 3}
    assert [e.message_index for e in hit.evidence] == [2, 4]
    assert run("tool_error_rate", bad, max_rate=0.7, min_calls=3) == []
    assert run("tool_error_rate", bad, max_rate=0.5, min_calls=4) == []


def test_tool_error_rate_ignores_user_side_tools() -> None:
    user_calls = {
        "role": "user",
        "content": None,
        "tool_calls": [
            {"id": f"u{i}", "type": "function", "function": {"name": "toggle_data", "arguments": "{}"}}
            for i in range(3)
        ],
    }
    msgs = [u("hi"), user_calls] + [
        {"role": "tool", "tool_call_id": f"u{i}", "content": "Error: x", "is_error": True} for i in range(3)
    ]
    msgs = build(*msgs, call("a"), ("result", "{}"), call("b"), ("result", "{}"), call("c"), ("result", "{}"))
    assert run("tool_error_rate", convo(*msgs), max_rate=0.3, min_calls=3) == []


# --- user_repetition --------------------------------------------------------------------------


def test_user_repetition() -> None:
    first = "I want to cancel order #W1234567 please"
    second = "I want to cancel order #W1234567, please!"
    conv = convo(u(first), a("Which order?"), u(second))
    [hit] = run("user_repetition", conv, threshold=85)
    assert [(e.message_index, e.start, e.end) for e in hit.evidence] == [
        (0, 0, len(first)),
        (2, 0, len(second)),
    ]
    assert hit.details["similarity"] >= 85


def test_user_repetition_below_threshold_and_short_turns() -> None:
    conv = convo(u("I want to cancel order #W1234567 please"), a("ok."), u("Actually, what is my refund amount?"))
    assert run("user_repetition", conv, threshold=85) == []
    assert run("user_repetition", convo(u("yes"), a("ok?"), u("yes")), threshold=85) == []


def test_user_repetition_containing_turn_is_not_a_repeat_by_default() -> None:
    conv = convo(
        u("cancel my order #W1234567"),
        a("Why?"),
        u("cancel my order #W1234567 because it is no longer needed and I ordered it by mistake"),
    )
    assert run("user_repetition", conv, threshold=85) == []
    assert len(run("user_repetition", conv, threshold=85, scorer="token_set_ratio")) == 1


# --- pii_leak ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value", "kind"),
    [
        ("Their email is jane.doe@example.com, ok.", "jane.doe@example.com", "email"),
        ("Call them on (555) 123-4567 today.", "(555) 123-4567", "phone"),
        ("Call them on +1 555 123 4567 today.", "+1 555 123 4567", "phone"),
        ("Our London desk: +44 20 7946 0958.", "+44 20 7946 0958", "phone"),
        ("Or +44 (0)20 7946 0958, ask for Ann.", "+44 (0)20 7946 0958", "phone"),
        ("Paris office +33 1 42 68 53 00 is open.", "+33 1 42 68 53 00", "phone"),
        ("Tokyo: +81-3-1234-5678", "+81-3-1234-5678", "phone"),
        ("Berlin +49 30 1234567 works too.", "+49 30 1234567", "phone"),
        ("The card on file is 4111 1111 1111 1111.", "4111 1111 1111 1111", "card"),
        ("The card on file is 4111-1111-1111-1111.", "4111-1111-1111-1111", "card"),
    ],
)
def test_pii_leak_found(text: str, value: str, kind: str) -> None:
    conv = convo(u("Who bought it?"), a(text))
    [hit] = run("pii_leak", conv)
    e = hit.evidence[0]
    assert hit.details == {"kind": kind} and e.message_index == 1
    assert text[e.start : e.end] == value
    assert e.quote is None  # the finding does not copy the personal data


@pytest.mark.parametrize(
    "text",
    [
        "Card 4111 1111 1111 1112 is on file.",  # 16 digits failing the Luhn check
        "Your item id is 7602931732.",  # a bare run of ten digits is an id, not a phone number
        "Tracking number 907614527588.",
        "Your order total is $1,234.50 on 2024-05-15.",
        "That is +12.50 USD more, and +1,234.50 over the year (+1.5%).",
        "Your score went up +100 points; the meeting is at 10:00 UTC+05:30.",
        "Reach: +10 000 000 users and +2 500 000 views.",  # signed amounts with thousands groups
        "Reference +1234567890123456789 is too long for any phone number.",
        "Order ORD-+44207946 and item 4420794609581 ship today.",
    ],
)
def test_pii_leak_not_found(text: str) -> None:
    assert run("pii_leak", convo(u("?"), a(text))) == []


def test_pii_leak_except_user_provided() -> None:
    conv = convo(
        u("My email is Jane.Doe@example.com and my phone is 555-123-4567"),
        a("Thanks, I found jane.doe@example.com and (555) 123-4567."),
    )
    assert run("pii_leak", conv) == []
    assert {h.details["kind"] for h in run("pii_leak", conv, except_user_provided=False)} == {
        "email",
        "phone",
    }
    assert [h.details["kind"] for h in run("pii_leak", conv, kinds=["email"], except_user_provided=False)] == ["email"]


# --- regex ------------------------------------------------------------------------------------


def test_regex_must_not_match() -> None:
    text = "Sorry: Traceback (most recent call last) in handler"
    conv = convo(u("hi"), a(text))
    [hit] = run("regex", conv, pattern=r"Traceback \(most recent call last\)")
    e = hit.evidence[0]
    assert e.message_index == 1 and text[e.start : e.end] == "Traceback (most recent call last)"
    assert run("regex", convo(u("Traceback (most recent call last)"), a("fine.")), pattern="Traceback") == []
    assert run("regex", conv, pattern="traceback", ignore_case=False) == []


def test_regex_must_match() -> None:
    conv = convo(u("hi"), a("Hello!"), a("Anything else?"))
    [hit] = run("regex", conv, pattern=r"\bthank", mode="must_match")
    assert hit.evidence[0].message_index == 2
    assert run("regex", conv, pattern=r"anything else", mode="must_match") == []
    assert len(run("regex", conv, pattern=r"\bhi\b", mode="must_match")) == 1
    assert run("regex", conv, pattern=r"\bhi\b", mode="must_match", roles=["user"]) == []


# --- groundedness -----------------------------------------------------------------------------


def grounded_conv(reply: str) -> Conversation:
    order = {
        "order_id": "#W5565470",
        "total": 1234.5,
        "placed": "2024-05-15",
        "items": [{"item_id": "7602931732"}],
        "payment": "gift_card_1712795",
    }
    return convo(
        *build(
            u("What about my order?"),
            call("get_order_details", order_id="#W5565470"),
            ("result", order),
            a(reply),
        )
    )


@pytest.mark.parametrize(
    "reply",
    [
        "Order #W5565470 totals $1,234.50, placed May 15, 2024.",
        "Order W5565470 was placed on 2024-05-15; item 7602931732 paid with gift_card_1712795.",
        "It was placed on May 15th.",
    ],
)
def test_groundedness_supported(reply: str) -> None:
    assert run("groundedness", grounded_conv(reply)) == []


@pytest.mark.parametrize(
    ("reply", "kind", "value"),
    [
        ("Your refund is $99.99.", "amount", "$99.99"),
        ("It ships on May 16, 2024.", "date", "May 16, 2024"),
        ("It ships on 2024-05-16.", "date", "2024-05-16"),
        ("Your order #W9999999 is on its way.", "identifier", "#W9999999"),
        ("Item 1111222233 is in stock.", "identifier", "1111222233"),
        ("Refund goes to gift_card_0000000.", "identifier", "gift_card_0000000"),
    ],
)
def test_groundedness_unsupported(reply: str, kind: str, value: str) -> None:
    conv = grounded_conv(reply)
    [hit] = run("groundedness", conv)
    assert hit.details == {"kind": kind} and hit.evidence[0].quote == value and hit.evidence[0].message_index == 3
    assert_spans(conv, [hit])
    others = [k for k in ("amounts", "dates", "identifiers") if not k.startswith(kind)]
    assert run("groundedness", conv, check=others) == []


def test_groundedness_user_turns_count_as_source() -> None:
    conv = convo(u("My budget is $250 and I fly on June 3"), a("Noted: $250 budget, flying June 3."))
    assert run("groundedness", conv) == []


# --- empty_or_truncated_response --------------------------------------------------------------


def test_empty_response() -> None:
    conv = convo(u("hi"), a(""), call("lookup"), {"role": "tool", "tool_call_id": "x", "content": "{}"})
    [hit] = run("empty_or_truncated_response", conv)
    assert hit.details == {"kind": "empty"} and hit.evidence[0].message_index == 1


def test_truncated_response() -> None:
    text = "I have looked at your order and the refund for the two items will be sent to your"
    conv = convo(u("refund?"), a(text))
    [hit] = run("empty_or_truncated_response", conv)
    e = hit.evidence[0]
    assert hit.details == {"kind": "truncated"} and (e.start, e.end) == (len(text) - 20, len(text))
    assert_spans(conv, [hit])
    cut = convo(u("refund?"), a("Your refund is on its way.", finish_reason="length"))
    assert len(run("empty_or_truncated_response", cut)) == 1


@pytest.mark.parametrize(
    "text",
    [
        "I have looked at your order and the refund is on its way.",
        "Thanks for reaching out, have a great day! 😊",
        "Your refund will be issued to the card ending in 1234",
        "Short reply",
    ],
)
def test_complete_responses(text: str) -> None:
    assert run("empty_or_truncated_response", convo(u("refund?"), a(text))) == []


# --- escalation -------------------------------------------------------------------------------


def test_escalation_by_tool() -> None:
    conv = convo(u("human please"), call("transfer_to_human_agents", summary="x"), a("Transferring."))
    [hit] = run("escalation", conv)
    assert hit.details == {"tool": "transfer_to_human_agents"} and hit.evidence[0].message_index == 1


@pytest.mark.parametrize(
    "text",
    [
        "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON.",
        "I'm transferring you to a live agent now.",
        "Let me connect you with a human representative.",
    ],
)
def test_escalation_by_phrase(text: str) -> None:
    conv = convo(u("help"), a(text))
    [hit] = run("escalation", conv)
    assert hit.evidence[0].message_index == 1 and hit.evidence[0].quote
    assert_spans(conv, [hit])


def test_no_escalation() -> None:
    conv = convo(u("help"), call("get_order_details"), a("Your order transfer is complete; a human signed for it."))
    assert run("escalation", conv) == []


# --- tool_calls_per_message -------------------------------------------------------------------


def test_tool_calls_per_message() -> None:
    parallel = convo(
        u("orders?"),
        calls(("get_order_details", {"order_id": "#1"}), ("get_order_details", {"order_id": "#2"})),
    )
    [hit] = run("tool_calls_per_message", parallel)
    assert hit.details == {"calls": 2} and hit.evidence[0].message_index == 1
    assert run("tool_calls_per_message", parallel, max_calls=2) == []
    talking = convo(u("orders?"), calls(("get_order_details", {"order_id": "#1"}), text="Let me check."))
    assert len(run("tool_calls_per_message", talking)) == 1
    assert run("tool_calls_per_message", talking, allow_text=True) == []
    assert run("tool_calls_per_message", convo(u("orders?"), call("get_order_details"), a("Found it."))) == []


def test_groundedness_amounts_tolerate_float_noise() -> None:
    conv = convo(
        *build(
            u("refund?"),
            call("get_order_details", order_id="#W1"),
            ("result", '{"refund": 30.180000000000007, "fee": 5.0}'),
            a("You get $30.18 back; the fee was $5."),
        )
    )
    assert run("groundedness", conv) == []
    [hit] = run(
        "groundedness",
        conv.model_copy(
            update={
                "messages": [
                    *conv.messages[:-1],
                    conv.messages[-1].model_copy(update={"content": "You get $30.17 back."}),
                ]
            }
        ),
    )
    assert hit.evidence[0].quote == "$30.17"


# --- patterns: the shortcuts must not change what matches -------------------------------------

PATTERNS = [
    DEFAULT_YES,
    DEFAULT_NO,
    EscalationArgs().phrases,
    r"Traceback \(most recent call last\)|Internal Server Error",
    r"^\s*(\"?error\b|Error:|Exception|Traceback)",
    r"\bREFUND\w*",
    r"\D{3}\d",  # case-dependent escape: runs with IGNORECASE
    r"(abc)?d|x[yz]",
]
TEXTS = [
    "Yes, please go ahead.",
    "No, wait. Don't do that.",
    "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON.",
    "Error: order not found",
    "Your Refunded amount is on its way",
    "İstanbul office: refunds take 5 days",  # lowercasing changes the length: falls back
    "nothing to see here",
    "xz and ABCD",
]


@pytest.mark.parametrize("pat", PATTERNS)
@pytest.mark.parametrize("ignore_case", [True, False])
def test_pattern_shortcuts_match_like_re(pat: str, ignore_case: bool) -> None:
    rx = re.compile(pat, re.IGNORECASE if ignore_case else 0)
    compiled_pattern = pattern(pat, ignore_case)
    for text in TEXTS:
        expected = rx.search(text)
        assert compiled_pattern.search(text) == (expected.span() if expected else None), text
        assert list(compiled_pattern.spans(text)) == [m.span() for m in rx.finditer(text)], text


def test_needles_are_required_literals() -> None:
    assert needles(EscalationArgs().phrases.lower()) == (
        "connect",
        "transfer",
        "you are being transferred to a human agent",
    )
    assert needles(r"(abc)?d|x[yz]") == ("d", "x")
    assert needles(r"a(?!bcd)") == ("a",)
    assert needles(r"\w+") is None


def test_user_repetition_ignores_word_order() -> None:
    conv = convo(u("please cancel order #W1234567 for me"), a("Which one?"), u("for me, cancel order #W1234567 please"))
    [hit] = run("user_repetition", conv, threshold=85)
    assert hit.details["similarity"] >= 85
    assert run("user_repetition", conv, threshold=85, scorer="ratio") == []


def test_export_redaction_covers_international_numbers() -> None:
    from vigil.export.redact import Redactor

    r = Redactor()
    text = "Call +44 20 7946 0958 or +33 1 42 68 53 00; order 7602931732 costs +12.50."
    assert r.text(text) == "Call [REDACTED:phone] or [REDACTED:phone]; order 7602931732 costs +12.50."


def test_a_refusal_part_is_text_the_rules_read() -> None:
    """OpenAI chat sends a model's refusal as ``{"type": "refusal", "refusal": "..."}``: stored as sent, its
    words were invisible to every rule (a refusal quoting a card number leaked it unseen)."""
    conv = convo(
        u("Read me back my card"),
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't share 4111 1111 1111 1111."}]},
    )
    assert conv.messages[1].text == "I can't share 4111 1111 1111 1111."
    [hit] = run("regex", conv, pattern=r"can't share")
    assert hit.evidence[0].message_index == 1
    assert_spans(conv, [hit])
    other = convo(u("x"), {"role": "assistant", "content": [{"type": "other", "refusal": "not a refusal part"}]})
    assert other.messages[1].text == ""
