"""The policy rule types (per-entity limits, one customer, values from a lookup, say-before, refused
writes, unresolved at the end, requests left undone, allowances charged) on small conversations and on
the real τ² runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.services import shared_data
from vigil.ingest.importers import load_file
from vigil.rules import RuleEngine
from vigil.rules.builtin_policy import (
    AllowanceChargeArgs,
    ArgFromLookupArgs,
    PerEntityLimitArgs,
    RequestKind,
    RequestLeftUndoneArgs,
    SayBeforeArgs,
    SingleEntityArgs,
    UnresolvedAtEndArgs,
    WriteRefusedArgs,
    allowance_charge,
    arg_from_lookup,
    per_entity_limit,
    request_left_undone,
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


def test_arg_from_lookup_checks_every_element_of_a_list_and_any_lookup_without_a_join() -> None:
    order = '{"items": [{"item_id": "111"}, {"item_id": "222"}]}'
    items = ArgFromLookupArgs(
        tools=["exchange"], arg="item_ids", lookup=["get_order"], join_on="order_id", field="item_id"
    )
    ok = _view(
        ("call", ("get_order", {"order_id": "1"}, order, False)),
        ("call", ("exchange", {"order_id": "1", "item_ids": ["111", "222", "111"]}, "{}", False)),
    )
    assert list(arg_from_lookup(ok, items)) == []
    stray = _view(
        ("call", ("get_order", {"order_id": "1"}, order, False)),
        ("call", ("get_order", {"order_id": "2"}, '{"items": [{"item_id": "333"}]}', False)),
        ("call", ("exchange", {"order_id": "1", "item_ids": ["111", "333"]}, "{}", False)),
    )
    (hit,) = arg_from_lookup(stray, items)
    assert hit.details == {"item_ids": ["333"], "order_id": "1"}  # 333 belongs to another order
    user = '{"user_id": "u", "payment_methods": {"paypal_1": {"id": "paypal_1"}, "gift_card_2": {"id": "gift_card_2"}}}'
    pay = ArgFromLookupArgs(tools=["modify_payment"], arg="payment_method_id", lookup=["get_user"], field="id")
    mine = _view(
        ("call", ("get_user", {"user_id": "u"}, user, False)),
        ("call", ("modify_payment", {"order_id": "9", "payment_method_id": "gift_card_2"}, "{}", False)),
    )
    assert list(arg_from_lookup(mine, pay)) == []
    made_up = _view(
        ("call", ("get_user", {"user_id": "u"}, user, False)),
        ("call", ("modify_payment", {"order_id": "9", "payment_method_id": "gift_card_0000000"}, "{}", False)),
    )
    assert [h.details for h in arg_from_lookup(made_up, pay)] == [{"payment_method_id": "gift_card_0000000"}]
    # nothing looked up: nothing to compare with (other rules say the lookup is missing)
    blind = _view(("call", ("modify_payment", {"payment_method_id": "gift_card_0000000"}, "{}", False)))
    assert list(arg_from_lookup(blind, pay)) == []


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


RETAIL_REQUESTS = RequestLeftUndoneArgs(
    closed_by=["transfer"],
    requests=[
        RequestKind(
            name="change an address", pattern=r"(?:can you|please)\b[^.?!]{0,80}?\baddress", tools=["modify_address"]
        ),
        RequestKind(name="cancel an order", pattern=r"(?:can you|please)\b[^.?!]{0,80}?\bcancel", tools=["cancel"]),
        RequestKind(
            name="change items", pattern=r"(?:can you|please)\b[^.?!]{0,80}?\b(?:change|exchange)", tools=["modify"]
        ),
    ],
)


def _undone(*steps: tuple[str, Any]) -> list[str]:
    return [h.details["request"] for h in request_left_undone(_view(*steps), RETAIL_REQUESTS)]


def test_request_left_undone_flags_a_request_no_write_carried_out() -> None:
    ask = ("user", "Hi. Can you cancel my order? It was a mistake.")
    assert _undone(ask, ("assistant", "Done.")) == ["cancel an order"]
    assert _undone(ask, ("call", ("cancel", {"order_id": "1"}, "{}", False))) == []
    # a refused write carries nothing out, whether the tool marks it as an error or only says so
    assert _undone(ask, ("call", ("cancel", {}, "order is processed", True))) == ["cancel an order"]
    assert _undone(ask, ("call", ("cancel", {}, "Error: order is processed", False))) == ["cancel an order"]
    # a write before the request does not carry it out; another kind's write does not either
    assert _undone(("call", ("cancel", {}, "{}", False)), ask) == ["cancel an order"]
    assert _undone(ask, ("call", ("modify", {}, "{}", False))) == ["cancel an order"]
    # withdrawn by the user, or handed to a human: not left undone
    assert _undone(ask, ("user", "Actually, never mind, I'll keep it.")) == []
    assert _undone(ask, ("user", "I changed my mind. Please change the size instead.")) == ["change items"]
    assert _undone(ask, ("call", ("transfer", {}, "Transfer successful", False))) == []
    # no request at all, or only a question about it
    assert _undone(("user", "Where is my order?"), ("assistant", "On its way.")) == []
    assert _undone(("user", "Is it possible to cancel it?")) == []


def test_request_left_undone_gives_each_sentence_its_most_specific_kind() -> None:
    # "change ... address" is an address change, not an item change: the earlier kind takes the sentence
    address = ("user", "Please change the shipping address on my order!")
    assert _undone(address) == ["change an address"]
    assert _undone(address, ("call", ("modify_address", {}, "{}", False))) == []
    both = ("user", "Please change the address. Can you also exchange the lamp?")
    assert sorted(_undone(both, ("assistant", "ok"))) == ["change an address", "change items"]
    assert _undone(both, ("call", ("modify_address", {}, "{}", False))) == ["change items"]
    hit = next(iter(request_left_undone(_view(both), RETAIL_REQUESTS)))
    text = "Please change the address. Can you also exchange the lamp?"
    ev = hit.evidence[0]
    assert ev.message_index == 0 and text[ev.start : ev.end] == ev.quote == "Please change the address"


def test_retail_requests_left_undone_on_real_runs() -> None:
    """The shipped retail check on the real gpt-4.1 retail run: it fires on more failed conversations than
    successful ones although failures are 6 of 40, and names a request every time."""
    engine = RuleEngine.from_paths([PROJECT_ROOT / "rules" / "tau2_retail.yaml"])
    path = shared_data("tau2", "trajectories", "sierra_gpt-4.1_retail_defautl_gpt-4.1_1trials.json")
    fired = {True: 0, False: 0}
    for conv in load_file(Path(path)):
        found = [f for f in engine.evaluate(conv) if f.rule_id == "retail-request-left-undone"]
        assert all(f.details["request"] and f.evidence for f in found)
        fired[conv.outcomes[0].value < 1] += bool(found)
    assert fired[True] >= 3 and fired[False] <= 5, fired


BAGS = AllowanceChargeArgs(
    tools=["book", "update_bags"],
    total_arg="total",
    charged_arg="paid",
    allowance={"regular": {"economy": 1, "business": 2}, "gold": {"economy": 3, "business": 4}},
    tier_field="membership",
    tier_from=["get_user"],
    category="cabin",
    people="passengers",
    join_on="reservation_id",
)
GOLD = ("call", ("get_user", {"user_id": "u"}, '{"user_id": "u", "membership": "gold"}', False))
TWO_IN_ECONOMY = (
    "call",
    ("get_res", {"reservation_id": "R"}, '{"reservation_id": "R", "cabin": "economy", "passengers": [{}, {}]}', False),
)


def _charges(*steps: tuple[str, Any]) -> list[tuple[int, int]]:
    return [(h.details["charged"], h.details["due"]) for h in allowance_charge(_view(*steps), BAGS)]


def test_allowance_charge_flags_paid_units_that_differ_from_the_allowance() -> None:
    def bags(total: int, paid: int) -> tuple[str, Any]:
        return ("call", ("update_bags", {"reservation_id": "R", "total": total, "paid": paid}, "{}", False))

    # gold, economy, two passengers: 6 bags free
    assert _charges(GOLD, TWO_IN_ECONOMY, bags(7, 1)) == []
    assert _charges(GOLD, TWO_IN_ECONOMY, bags(5, 0)) == []
    assert _charges(GOLD, TWO_IN_ECONOMY, bags(6, 1)) == [(1, 0)]  # charged for a free bag
    assert _charges(GOLD, TWO_IN_ECONOMY, bags(9, 1)) == [(1, 3)]  # bags given free beyond the allowance
    # the reservation's latest state counts: after an upgrade to business, 8 free
    upgraded = ("call", ("upgrade", {"reservation_id": "R"}, '{"reservation_id": "R", "cabin": "business"}', False))
    assert _charges(GOLD, TWO_IN_ECONOMY, upgraded, bags(8, 0)) == []
    assert _charges(GOLD, TWO_IN_ECONOMY, bags(8, 0)) == [(0, 2)]
    # a booking carries its own cabin and passengers; the tier comes only from the profile tool
    book = ("call", ("book", {"cabin": "business", "passengers": [{}], "total": 3, "paid": 0}, "{}", False))
    assert _charges(("call", ("get_user", {}, '{"membership": "regular"}', False)), book) == [(0, 1)]
    other = ("call", ("get_res", {}, '{"membership": "regular"}', False))
    assert _charges(other, book) == []  # no tier seen: nothing flagged
    # nothing flagged without the tier, the category or the people
    assert _charges(TWO_IN_ECONOMY, bags(6, 1)) == []
    assert _charges(GOLD, bags(6, 1)) == []


def test_airline_bag_allowance_on_real_runs() -> None:
    """On the real gpt-4.1 airline run, the allowance check fires only where a gold member in economy was
    charged for a bag the policy gives free (task 22, graded failed)."""
    engine = RuleEngine.from_paths([PROJECT_ROOT / "rules" / "tau2_airline.yaml"])
    path = shared_data("tau2", "trajectories", "sierra_gpt-4.1_airline_default_gpt-4.1_1trials.json")
    fired = []
    for conv in load_file(Path(path)):
        for f in engine.evaluate(conv):
            if f.rule_id == "airline-bag-allowance":
                fired.append((conv.task_id, conv.outcomes[0].value, f.details["charged"], f.details["due"]))
    assert fired == [("airline:22", 0.0, 1, 0)]


def test_a_lookup_result_keeps_an_integer_beyond_64_bits_exact() -> None:
    """A tool result is read with every integer exact: an id of 2**70 + 1 in the result matches the same id
    in a later call (read as the nearest double, it would be 2**70 and the call would be flagged)."""
    wide = 2**70 + 1
    items = ArgFromLookupArgs(
        tools=["exchange"], arg="item_ids", lookup=["get_order"], join_on="order_id", field="item_id"
    )
    order = f'{{"items": [{{"item_id": {wide}}}]}}'
    ok = _view(
        ("call", ("get_order", {"order_id": "1"}, order, False)),
        ("call", ("exchange", {"order_id": "1", "item_ids": [wide]}, "{}", False)),
    )
    assert list(arg_from_lookup(ok, items)) == []
    off_by_one = _view(
        ("call", ("get_order", {"order_id": "1"}, order, False)),
        ("call", ("exchange", {"order_id": "1", "item_ids": [wide - 1]}, "{}", False)),
    )
    assert len(list(arg_from_lookup(off_by_one, items))) == 1
