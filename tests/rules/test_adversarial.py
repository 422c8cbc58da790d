"""Hostile texts up to VIGIL_MAX_MESSAGE_BYTES: every built-in rule type and the export redactor stay linear.

Each case is timed at sizes growing 4× at a time. What is timed is the CPU time of the checking thread
(`time.thread_time`), best of several runs, with the input built beforehand: a busy machine that keeps
the check off a core adds nothing, and what noise remains only adds upward, so the minimum is kept.
The verdict is the slope of log(time) against log(size) over the sizes that take long enough to
judge (at least 5 ms): a linear check has a slope near 1, a quadratic one near 2; the bound is 1.5.
A case that already takes over 3 s at some size stops growing there (a quadratic one shows it by
then); the rule time budget (VIGIL_RULE_TIMEOUT_MS) is what protects production from such a case.
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Callable
from typing import Any

import pytest

from vigil.rules import ConversationView, registered_rule_types
from vigil.schema import Conversation
from vigil.settings import Settings

MAX_BYTES = Settings().max_message_bytes
SIZES = [MAX_BYTES // 64, MAX_BYTES // 16, MAX_BYTES // 4, MAX_BYTES - 4096]
REPEATS = 3
FLOOR_SECONDS = 0.005
CAP_SECONDS = 3.0
SLOPE_BOUND = 1.5


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# Hostile shapes of text, each a function of its size in characters.
TEXTS: dict[str, Callable[[int], str]] = {
    "dotted_email": lambda n: "a." * (n // 2 - 1) + " @",
    "digits": lambda n: "1" * n,
    "spaced_digits": lambda n: "1 " * (n // 2),
    "separators": lambda n: "1-2." * (n // 4),
    "phone_groups": lambda n: "+1 (2) " * (n // 7),
    "amounts": lambda n: "$1,000" * (n // 6),
    "brackets": lambda n: "(" * (n // 2) + ")" * (n // 2),
    "spaces": lambda n: " " * (n - 1) + "x",
    "identifiers": lambda n: " ".join(f"A{i}B" for i in range(n // 8)),
    "snake": lambda n: "a_" * (n // 2 - 1) + "1",
    "months": lambda n: "Jan 1st, " * (n // 9),
    "no_no": lambda n: "no, " * (n // 4),
    "spelled_email": lambda n: "a dot " * (n // 6) + "at",
    "obfuscated_at": lambda n: "a [at] " * (n // 7),
    "token_run": lambda n: "sk-" + "A" * (n - 3),
    "jwt_dots": lambda n: "eyJ" + "a." * (n // 2 - 2),
    "keywords": lambda n: "password " * (n // 9),
    "codes": lambda n: "OTP: 592011 reset pin is " * (n // 25),
    "street": lambda n: "1 Main " * (n // 7),
    "iban": lambda n: "GB82 " * (n // 5),
    "dotted_digits": lambda n: "4.2" * (n // 3),
    "idn": lambda n: "é." * (n // 2 - 1) + "@",
    "base64_runs": lambda n: "QUJDREVGR0hJSktM " * (n // 17),  # each decodes to printable text
    "base64_emails": lambda n: " ".join(_b64(b"mail j%d@example.com" % i) for i in range(n // 33)),
    "base64_zero_width": lambda n: "QUJD\u200bREVG" * (n // 9),
    "wide_at": lambda n: "a" + " " * (n // 2 - 10) + "[at]" + " " * (n // 2 - 10) + "b dot com",
}


def conversation(text: str) -> Conversation:
    """The text in every place a rule reads: user and assistant turns, tool calls and results."""
    half = text[: len(text) // 2]
    return Conversation.model_validate(
        {
            "conversation_id": "hostile",
            "agent_id": "a",
            "agent_version": "v",
            "messages": [
                {"role": "system", "content": half},
                {"role": "user", "content": text},
                {"role": "user", "content": text[::-1]},
                {
                    "role": "assistant",
                    "content": half,
                    "tool_calls": [
                        {"id": "t1", "function": {"name": "write", "arguments": {"x": half}}},
                        {"id": "t2", "function": {"name": "read", "arguments": half}},
                    ],
                },
                {"role": "tool", "tool_call_id": "t1", "content": half},
                {"role": "tool", "tool_call_id": "t2", "content": '{"status": "' + half + '"}'},
                {"role": "user", "content": half},
                {"role": "assistant", "content": text},
            ],
        }
    )


ARGS: dict[str, dict[str, Any]] = {
    "regex": {"pattern": r"(a+)+b|(\d+\s?)+x|(?:[a-z]+\.)+@"},
    "forbidden_tool": {"tools": ["write"], "when": [{"field": "status", "values": ["x"]}]},
    "tool_order": {"before": ["read"], "after": ["write"], "same_arg": "x"},
    "require_confirmation": {"tools": ["write"]},
    "budget": {"max_turns": 1, "max_tool_calls": 0},
    "tool_error_rate": {"min_calls": 1},
    "per_entity_limit": {"tools": ["write"], "key": "x"},
    "single_entity": {"key": "x"},
    "arg_from_lookup": {"tools": ["write"], "arg": "x", "lookup": ["read"], "join_on": "x"},
    "unresolved_at_end": {"tools": ["read"], "unresolved": ["a.", "1 "]},
    "say_before": {"tools": ["write"], "phrases": ["no, ", "a.a"]},
    "write_refused": {"tools": ["write"]},
    "allowance_charge": {
        "tools": ["write"],
        "total_arg": "x",
        "charged_arg": "x",
        "allowance": {"a": {"b": 1}},
        "tier_field": "status",
        "category": "status",
        "people": "x",
        "join_on": "x",
    },
    "request_left_undone": {
        "requests": [
            {"name": "nested", "pattern": r"(?:a\.)+ @|(?:no, )+x|(?:1 )+a", "tools": ["none"]},
            {"name": "asked", "pattern": r"(?:please|can you|no)\b[^.?!]{0,80}?\b(?:1|at|main)\b", "tools": ["none"]},
            {"name": "often", "pattern": r"no, no|1-2|\$1,", "tools": ["none"]},
        ]
    },
}


def best_time(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
        if best > CAP_SECONDS:
            break
    return best


def slope(timings: list[tuple[int, float]]) -> float:
    """Least-squares slope of log(time) on log(size) over the judged sizes (1 ≈ linear, 2 ≈ quadratic)."""
    points = [(math.log(n), math.log(t)) for n, t in timings if t >= FLOOR_SECONDS]
    if len(points) < 2:
        return 0.0  # too fast at every size but one to judge: nothing grows here
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def growth(
    prepare: Callable[[str], Callable[[], object]], shape: Callable[[int], str]
) -> tuple[float, list[tuple[int, float]]]:
    """The log-log slope of time against size, and the timings."""
    timings: list[tuple[int, float]] = []
    for size in SIZES:
        timings.append((size, best_time(prepare(shape(size)))))
        if timings[-1][1] > CAP_SECONDS:
            break
    return slope(timings), timings


def rule_runner(name: str) -> Callable[[str], Callable[[], object]]:
    rtype = registered_rule_types()[name]
    args = rtype.args_model.model_validate(ARGS.get(name, {}))

    def prepare(text: str) -> Callable[[], object]:
        convo = conversation(text)
        return lambda: list(rtype.fn(ConversationView(convo), args))

    return prepare


CASES = sorted(registered_rule_types())


@pytest.mark.slow
@pytest.mark.parametrize("rule_type", CASES)
def test_every_built_in_rule_type_is_linear_on_hostile_text(rule_type: str) -> None:
    run = rule_runner(rule_type)
    report = {}
    for shape_name, shape in TEXTS.items():
        worst, timings = growth(run, shape)
        if worst > SLOPE_BOUND:  # measured once more: on a machine whose every core is busy, the largest text
            # can lose its caches to other work (a linear rule measured 1.59 once); superlinear code stays over
            worst, timings = min((worst, timings), growth(run, shape), key=lambda r: r[0])
        report[shape_name] = (worst, timings)
    bad = {k: v for k, v in report.items() if v[0] > SLOPE_BOUND}
    assert not bad, f"{rule_type} grows superlinearly: " + "; ".join(
        f"{k}: slope {w:.2f} ({', '.join(f'{n}: {t * 1000:.1f} ms' for n, t in ts)})" for k, (w, ts) in bad.items()
    )


@pytest.mark.slow
def test_the_export_redactor_is_linear_on_hostile_text() -> None:
    from vigil.export.redact import Redactor

    redactor = Redactor({}).with_names(["Jane Doe", "Li", "Ann Lee Smith", "a", "x" * 90])

    def prepare(text: str) -> Callable[[], object]:
        return lambda: redactor.text(text)

    worst, timings = growth(prepare, TEXTS["dotted_email"])

    def names(n: int) -> str:  # every word a name, whole or a part, and one that starts a longer name
        return "Ann Lee Ann-Lee ann_lee " * (n // 24)

    for shape in [*TEXTS.values(), names]:
        w, _ = growth(prepare, shape)
        worst = max(worst, w)
    assert worst <= SLOPE_BOUND, f"redactor grows with slope {worst:.2f}: {timings}"


@pytest.mark.parametrize("spin_first", [True, False], ids=["spin_first", "spin_after_a_cheap_rule"])
def test_a_rule_over_its_budget_yields_a_rule_timeout_finding(spin_first: bool) -> None:
    """Also when the watchdog was last armed for an earlier rule's deadline and must find the later one."""
    from vigil.rules import RuleArgs, rule_type
    from vigil.rules.packs import CompiledRule, RuleEngine, RuleSpec
    from vigil.rules.registry import get_rule_type

    class SpinArgs(RuleArgs):
        pass

    def spin(view: ConversationView, args: SpinArgs):  # type: ignore[no-untyped-def]
        while True:  # a rule with a bug: never returns
            pass
        yield  # pragma: no cover

    if "test_spin" not in registered_rule_types():
        rule_type("test_spin", SpinArgs)(spin)

    spec = RuleSpec(id="spin", type="test_spin", severity="high")
    rt = get_rule_type("test_spin")
    other = RuleSpec(id="budget", type="budget", args={"max_turns": 1})
    rules = [
        CompiledRule("spin", "p", spec, rt, SpinArgs()),
        CompiledRule("budget", "p", other, get_rule_type("budget"), ARGS_BUDGET),
    ]
    engine = RuleEngine(rules if spin_first else rules[::-1])
    engine.timeout_seconds = 0.05
    findings = engine.evaluate(conversation("hello there"))
    timeout = [f for f in findings if f.rule_id == "spin"]
    assert len(timeout) == 1 and timeout[0].severity == "info"
    assert timeout[0].details == {"rule_error": True, "rule_timeout": True}
    assert [f.rule_id for f in findings if f.rule_id == "budget"] == ["budget"]  # the other rule ran too


ARGS_BUDGET = registered_rule_types()["budget"].args_model.model_validate({"max_turns": 1})


def test_a_rule_that_waits_for_a_core_is_not_stopped() -> None:
    """The budget is CPU time: a loaded host that keeps a rule off the CPU does not spend it."""
    from vigil.rules import RuleArgs, rule_type
    from vigil.rules.packs import CompiledRule, RuleEngine, RuleSpec
    from vigil.rules.registry import get_rule_type

    class NapArgs(RuleArgs):
        pass

    @rule_type("test_nap", NapArgs)
    def nap(view: ConversationView, args: NapArgs):  # type: ignore[no-untyped-def]
        time.sleep(0.3)  # off the CPU, as a thread descheduled on a busy machine is
        return iter(())

    spec = RuleSpec(id="nap", type="test_nap", severity="high")
    engine = RuleEngine([CompiledRule("nap", "p", spec, get_rule_type("test_nap"), NapArgs())])
    engine.timeout_seconds = 0.05
    assert engine.evaluate(conversation("hello there")) == []


def test_rules_that_each_spend_most_of_their_budget_are_not_stopped() -> None:
    """The budget is each rule's own: CPU spent by the rules before it in the conversation is not charged
    to it, although the guard reads the thread's CPU clock once per conversation, not per rule."""
    from vigil.rules import RuleArgs, rule_type
    from vigil.rules.packs import CompiledRule, RuleEngine, RuleSpec
    from vigil.rules.registry import get_rule_type

    class BusyArgs(RuleArgs):
        pass

    if "test_busy" not in registered_rule_types():

        @rule_type("test_busy", BusyArgs)
        def busy(view: ConversationView, args: BusyArgs):  # type: ignore[no-untyped-def]
            # off the CPU past the wall-clock deadline (the watchdog then reads what it spent), then 40%
            # of the budget below in this thread's CPU time: four of them spend more than one budget
            time.sleep(0.12)
            until = time.thread_time() + 0.04
            while time.thread_time() < until:
                pass
            return iter(())

    rt = get_rule_type("test_busy")
    rules = [CompiledRule(f"busy{i}", "p", RuleSpec(id=f"busy{i}", type="test_busy"), rt, BusyArgs()) for i in range(4)]
    engine = RuleEngine(rules)
    engine.timeout_seconds = 0.1
    assert engine.evaluate(conversation("hello there")) == []


def _chain(texts: list[str], user_between: bool = False) -> Conversation:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "?"}]
    for t in texts:
        messages.append({"role": "assistant", "content": t})
        if user_between:
            messages.append({"role": "user", "content": "go on"})
    return Conversation.model_validate(
        {"conversation_id": "hostile", "agent_id": "a", "agent_version": "v", "messages": messages}
    )


# Consecutive assistant messages, read across their boundaries (vigil.rules.pii_split), each a function of
# the conversation's size in characters: many tiny chunks, two huge replies, digits at every boundary.
CHAINS: dict[str, Callable[[int], Conversation]] = {
    "tiny_chunks": lambda n: _chain(["ab. "] * (n // 4)),
    "tiny_digit_chunks": lambda n: _chain(["4111 1111"] * (n // 9)),
    "digit_per_chunk": lambda n: _chain(["1"] * (n // 8)),
    "tiny_emails": lambda n: _chain(["jane.doe", "@example.com "] * (n // 21), user_between=True),
    "huge_replies": lambda n: _chain(["1 " * (n // 4), "2 " * (n // 4)]),
    "huge_digit_runs": lambda n: _chain(["4" * (n // 2), "1" * (n // 2)]),
    "many_mid_size": lambda n: _chain(["word " * 120 + "4111 1111"] * (n // 609)),
    # a keyword ending each reply, its value opening the next; a keyword glued to the next at every boundary
    "keyword_then_value": lambda n: _chain(["Your password is", "hunter2!x for now"] * (n // 33)),
    "glued_keywords": lambda n: _chain(["token"] * (n // 5)),
    "keyword_then_spaces": lambda n: _chain(["call me at", " " * 500 + "4155550123"] * (n // 520)),
    "keyword_glued_to_digits": lambda n: _chain(["Her mobile", "4155550123", "DOB", "03/14/1985"] * (n // 33)),
    # a word its keyword labels ending every reply, read on into the next
    "keyword_then_word": lambda n: _chain(["password: Open"] * (n // 14)),
    "keyword_far_then_word": lambda n: _chain([" " * 300 + "password: Open"] * (n // 314)),
}


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(CHAINS))
def test_pii_leak_is_linear_across_message_boundaries(shape: str) -> None:
    rtype = registered_rule_types()["pii_leak"]
    args = rtype.args_model.model_validate({"kinds": ["email", "phone", "card", "ssn", "iban", "ip", "secret"]})

    def prepare(convo: Conversation) -> Callable[[], object]:
        return lambda: list(rtype.fn(ConversationView(convo), args))

    worst, timings = growth(prepare, CHAINS[shape])  # type: ignore[arg-type]  # a conversation, not a text
    if worst > SLOPE_BOUND:  # once more, as for the rule types above: a busy machine can cost the largest size
        worst, timings = min((worst, timings), growth(prepare, CHAINS[shape]), key=lambda r: r[0])  # type: ignore[arg-type]
    shown = ", ".join(f"{n}: {t * 1000:.1f} ms" for n, t in timings)
    assert len(timings) > 1, f"pii_leak across boundaries takes over {CAP_SECONDS} s at the smallest size: {shown}"
    assert worst <= SLOPE_BOUND, f"pii_leak across boundaries grows with slope {worst:.2f}: {shown}"


# Chains whose replies hold JSON, which export redaction reads across boundaries as pii_leak does and whose
# parts it replaces in the JSON: many short replies, one huge array of numbers after a keyword.
JSON_CHAINS: dict[str, Callable[[int], Conversation]] = {
    "json_after_keywords": lambda n: _chain(["Reach her at", '{"n": "4155550123"}'] * (n // 31)),
    "json_after_a_glued_value": lambda n: _chain(["Use token=abc", "[1234]"] * (n // 19)),
    "huge_json_after_a_keyword": lambda n: _chain(["Her mobile number:", "[" + "4155550123, " * (n // 12) + "1]"]),
    "escaped_json_after_keywords": lambda n: _chain(["Reach her at", '["4155550123\\u00a0"]'] * (n // 32)),
}


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted({**CHAINS, **JSON_CHAINS}))
def test_export_redaction_is_linear_across_message_boundaries(shape: str) -> None:
    from vigil.export.redact import Redactor, redact_task

    def prepare(convo: Conversation) -> Callable[[], object]:
        messages = [m.model_dump(exclude_none=True) for m in convo.messages]
        task = {"messages": messages[:-1], "failure": {"failed_turn": messages[-1], "rules": [], "judges": []}}
        return lambda: redact_task(Redactor(), task)

    chains = {**CHAINS, **JSON_CHAINS}
    worst, timings = growth(prepare, chains[shape])  # type: ignore[arg-type]  # a conversation, not a text
    if worst > SLOPE_BOUND:  # once more, as above: a busy machine can cost the largest size
        worst, timings = min((worst, timings), growth(prepare, chains[shape]), key=lambda r: r[0])  # type: ignore[arg-type]
    shown = ", ".join(f"{n}: {t * 1000:.1f} ms" for n, t in timings)
    assert len(timings) > 1, f"export redaction takes over {CAP_SECONDS} s at the smallest size: {shown}"
    assert worst <= SLOPE_BOUND, f"export redaction across boundaries grows with slope {worst:.2f}: {shown}"
