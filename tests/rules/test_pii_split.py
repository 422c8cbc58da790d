"""A value split across consecutive assistant messages is a leak like any other: ``pii_leak`` finds it across
the boundary, once, with every part's span, and export redaction replaces every part."""

from __future__ import annotations

from typing import Any

import pytest

from tests.rules.test_rules_builtin import a, convo, run, u
from vigil.rules import pii, pii_split

ALL_KINDS = list(pii.KINDS)


def _split_hits(*messages: dict[str, Any], **args: Any) -> list[Any]:
    return run("pii_leak", convo(*messages), **{"kinds": ALL_KINDS, **args})


def _written(conv_messages: tuple[dict[str, Any], ...], hit: Any) -> str:
    """The value as the parts of its evidence hold it, in message order."""
    return "".join(conv_messages[e.message_index]["content"][e.start : e.end] for e in reversed(hit.evidence))


@pytest.mark.parametrize(
    ("kind", "first", "second", "value"),
    [
        ("email", "You can write to her at jane.doe", "@example.com, she answers fast.", "jane.doe@example.com"),
        ("phone", "Her mobile is (415) 555-", "0123, after six.", "(415) 555-0123"),
        ("card", "The card on file is 4111 1111", "1111 1111.", "4111 11111111 1111"),  # two replies: read spaced
        ("card", "The card on file is 4111 1111 11", "11 1111, expiring 04/27.", "4111 1111 1111 1111"),  # streamed
        ("ssn", "His SSN is 123-45-", "6789, as on the form.", "123-45-6789"),
        ("iban", "Wire it to GB82 WEST 1234", "5698 7654 32 today.", "GB82 WEST 12345698 7654 32"),
        ("ip", "The admin console is at 192.168.", "10.24 on the office network.", "192.168.10.24"),
        ("dob", "She was born on March 14", ", 1985, in Leeds.", "March 14, 1985"),
        ("address", "Ship it to 1600 Pennsylvania", " Avenue NW, Washington, DC 20500.", "1600 Pennsylvania Avenue NW"),
        ("secret", "Use the key sk-proj-4fGh8KlmN2", "pQrS7tUvW9xYz1AbCd in the header.", None),
        ("secret", "The admin password is hun", "ter2!x9 for now.", "hunter2!x9"),
    ],
)
def test_a_value_split_across_two_replies_is_found(kind: str, first: str, second: str, value: str | None) -> None:
    messages = (u("What do you have on file?"), a(first), a(second))
    [hit] = run("pii_leak", convo(*messages), kinds=ALL_KINDS)
    assert hit.details == {"kind": kind, "split_across": [1, 2]}
    assert "split across assistant messages 1, 2" in hit.message
    assert [e.message_index for e in hit.evidence] == [2, 1]  # the completing message first
    assert all(e.quote is None for e in hit.evidence)
    first_part, second_part = hit.evidence[1], hit.evidence[0]
    assert first_part.end == len(first) and second_part.start == 0
    written = _written(messages, hit)
    assert written.replace(" ", "") == (value or "sk-proj-4fGh8KlmN2pQrS7tUvW9xYz1AbCd").replace(" ", "")


def test_a_value_streamed_as_several_chunks_is_found_once() -> None:
    chunks = ("Your card: 4111", " 1111", " 1111", " 1111", ", exp 04/27.")
    messages = (u("Read me my card"), *(a(c) for c in chunks))
    [hit] = run("pii_leak", convo(*messages))
    assert hit.details == {"kind": "card", "split_across": [1, 2, 3, 4]}
    assert _written(messages, hit) == "4111 1111 1111 1111"


def test_a_user_turn_between_replies_does_not_hide_a_split_value() -> None:
    [hit] = run("pii_leak", convo(u("Her number?"), a("Call her at (415) 555-"), u("go on"), a("0123.")))
    assert hit.details == {"kind": "phone", "split_across": [1, 3]}


def test_numbers_across_a_boundary_that_form_no_valid_value_are_not_reported() -> None:
    first, second = "The first code is 4111 1111", "2222 3333 is the second one."
    assert not pii.luhn_ok("4111111122223333")  # read together they fail the Luhn check
    assert _split_hits(u("Codes?"), a(first), a(second)) == []
    assert _split_hits(u("Codes?"), a("Order 1234"), a("5678 shipped on the 3rd.")) == []  # under the digit gate
    # a signed amount streamed in two: read as written, not as "+1 0 000 000" (a phone number's shape)
    assert _split_hits(u("Reach?"), a("Reach: +1"), a("0 000 000 users.")) == []


def test_a_value_inside_one_message_is_not_reported_again_at_its_boundary() -> None:
    """``jane@example.co`` is an address of its own; read on into the next chunk it is ``jane@example.com``:
    one leak, reported where it was found."""
    hits = run("pii_leak", convo(u("?"), a("Mail jane@example.co"), a("m or call 4111 1111 1111 1111"), a("5 more")))
    assert [(h.details, [(e.message_index, e.start, e.end) for e in h.evidence]) for h in hits] == [
        ({"kind": "email"}, [(1, 5, 20)]),
        ({"kind": "card"}, [(2, 10, 29)]),
    ]


def test_a_tool_result_between_replies_ends_the_chain() -> None:
    tool_call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    conv = convo(
        u("?"),
        a("Your card is 4111 1111", tool_calls=[tool_call]),
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        a("1111 1111"),
    )
    assert run("pii_leak", conv) == []


def test_a_split_value_the_user_gave_is_not_a_leak() -> None:
    messages = (u("My email is Jane.Doe@example.com"), a("I found jane.doe"), a("@example.com on file."))
    assert run("pii_leak", convo(*messages)) == []
    [hit] = run("pii_leak", convo(*messages), except_user_provided=False)
    assert hit.details == {"kind": "email", "split_across": [1, 2]}


def test_a_split_value_after_a_long_reply_is_found() -> None:
    long = "Thanks for waiting. " * 3000 + "The card on file is 4111 1111"
    [hit] = run("pii_leak", convo(u("?"), a(long), a("1111 1111.")))
    assert hit.details["split_across"] == [1, 2]
    assert long[hit.evidence[1].start :] == "4111 1111"


def test_a_window_edge_inside_a_word_does_not_make_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read from its second character, ``94111 1111 11`` + ``11 1111`` is a Luhn-valid card; as written it
    is not one (its first group has five digits)."""
    monkeypatch.setattr(pii_split, "REACH", 12)
    assert _split_hits(u("?"), a("94111 1111 11"), a("11 1111")) == []
    assert _split_hits(u("?"), a(" 4111 1111 11"), a("11 1111")) != []


@pytest.mark.parametrize(
    "texts",
    [
        ["", "Write to jane.doe", "@example.com."],
        ["Write to jane.doe", "", "@example.com."],
        ["Write to jane.doe", "@example.com.", ""],
        ["", "Write to jane.doe", "", "", "@example.com.", ""],
    ],
)
def test_empty_texts_in_a_chain_are_passed_over(texts: list[str]) -> None:
    """``splits`` took the ends of an empty text first or last for boundaries, and read the character before
    or after them (without ``secret``): IndexError. Its callers pass no empty text; the function is public."""
    for kinds in (pii.KINDS, ("email", "phone", "card")):  # without secret, boundaries are read by their characters
        inside = [pii.detect(t, kinds) for t in texts]
        [split] = pii_split.splits(texts, kinds, inside)
        assert split.kind == "email" and split.value == "jane.doe@example.com"
        assert "".join(texts[p.index][p.start : p.end] for p in split.parts) == "jane.doe@example.com"


def test_hidden_characters_in_a_split_value_are_folded() -> None:
    messages = (u("?"), a("Write to jane\u200b.doe"), a("＠example.com."))
    [hit] = run("pii_leak", convo(*messages))
    assert hit.details == {"kind": "email", "split_across": [1, 2]}
    assert _written(messages, hit) == "jane\u200b.doe＠example.com"


def test_export_redaction_replaces_every_part_of_a_split_value() -> None:
    from vigil.export.redact import Redactor, redact_task

    redactor = Redactor()
    task = {
        "messages": [
            {"role": "user", "content": "What is on file?"},
            {"role": "assistant", "content": "Your card is 4111 1111"},
            {"role": "user", "content": "and?"},
        ],
        "failure": {
            "message_index": 3,
            "failed_turn": {"role": "assistant", "content": "1111 1111, and 4111 2222."},
            "rules": [],
            "judges": [],
        },
    }
    out = redact_task(redactor, task)
    assert out["messages"][1]["content"] == "Your card is [REDACTED:card]"
    assert out["failure"]["failed_turn"]["content"] == "[REDACTED:card], and 4111 2222."
    assert redactor.counts == {"card": 1}  # one value, counted once


def test_export_redaction_replaces_a_value_that_runs_on_into_the_next_message_whole() -> None:
    from vigil.export.redact import Redactor, redact_task

    redactor = Redactor()
    task = {
        "messages": [{"role": "assistant", "content": "Mail jane@example.co"}],
        "failure": {"failed_turn": {"role": "assistant", "content": "m today."}, "rules": [], "judges": []},
    }
    out = redact_task(redactor, task)
    assert out["messages"][0]["content"] == "Mail [REDACTED:email]"
    assert out["failure"]["failed_turn"]["content"] == "[REDACTED:email] today."
    assert redactor.counts == {"email": 1}


def test_export_redaction_still_reads_a_json_reply_value_by_value_beside_a_split() -> None:
    """A reply holding a JSON object next to a reply a secret could run on from was read across the boundary
    as raw text (``hunter2`` + ``{"contact":``), so its values were no longer read as JSON: an address
    written with JSON escapes stayed in the export."""
    from vigil.export.redact import Redactor, redact_task

    redactor = Redactor()
    reply = '{"contact": "jane\\u002edoe\\u0040example.com", "phone": "4155550123"}'
    task = {
        "messages": [{"role": "user", "content": "?"}, {"role": "assistant", "content": "password: hunter2"}],
        "failure": {"failed_turn": {"role": "assistant", "content": reply}, "rules": [], "judges": []},
    }
    out = redact_task(redactor, task)
    assert out["messages"][1]["content"] == "password: [REDACTED:secret]"
    assert out["failure"]["failed_turn"]["content"] == '{"contact":"[REDACTED:email]","phone":"[REDACTED:phone]"}'
    assert redactor.counts == {"secret": 1, "email": 1, "phone": 1}


def test_the_failing_turn_of_an_exported_split_leak_is_the_one_that_completes_it() -> None:
    from vigil.export.tasks import failure_index

    conv = convo(u("?"), a("Your card is 4111 1111"), a("1111 1111"), a("Anything else?"))
    [hit] = run("pii_leak", conv)
    finding = {"severity": "critical", "evidence": [e.as_dict() for e in hit.evidence], "details": hit.details}
    idx, _ = failure_index(conv.messages, [finding])
    assert idx == 2  # the task's history then holds message 1, so both parts are redacted on export


# A keyword ending one reply and its value opening the next: the value lies in one message, and is one only
# by the words before it.
KEYWORD_THEN_VALUE = [
    ("secret", "Your temporary password is:", "hunter2!x", "hunter2!x"),
    ("secret", "Your temporary password is", "hunter2!x, change it soon.", "hunter2!x"),
    ("secret", "The API key", "sk_9f8a7b6c5d today", "sk_9f8a7b6c5d"),
    ("secret", "DB_PASSWORD=", "s3cr3t-Val", "s3cr3t-Val"),
    ("phone", "You can reach her at", "4155550123 after six.", "4155550123"),
    ("phone", "Her mobile number:", " 4155550123", "4155550123"),
    ("dob", "Her date of birth is", "03/14/1985, as on file.", "03/14/1985"),
    ("ssn", "His SSN is", "123456789.", "123456789"),
    # the keyword itself ends the reply, the digits open the next: streamed, "DOB03/14/1985" is no date after
    # its keyword (no word boundary), so the window is read with a space there too
    ("dob", "Patient DOB", "03/14/1985", "03/14/1985"),
    ("ssn", "His SSN", "123456789 (verified)", "123456789"),
    ("phone", "Her mobile", "4155550123", "4155550123"),
]


@pytest.mark.parametrize(("kind", "first", "second", "value"), KEYWORD_THEN_VALUE)
def test_a_value_after_its_keyword_in_the_reply_before_is_found(kind: str, first: str, second: str, value: str) -> None:
    messages = (u("What do you have on file?"), a(first), a(second))
    assert run("pii_leak", convo(u("?"), a(second)), kinds=ALL_KINDS) == []  # alone, the value is none
    [hit] = run("pii_leak", convo(*messages), kinds=ALL_KINDS)
    assert hit.details == {"kind": kind, "split_across": [1, 2]}
    assert hit.message == f"{kind} in assistant message 2 after its keyword in message 1"
    [evidence] = hit.evidence  # the value's span only: the keyword is no personal data
    assert (evidence.message_index, second[evidence.start : evidence.end]) == (2, value)


def test_a_value_after_its_keyword_streamed_in_chunks_is_found() -> None:
    chunks = ("Your password", " is ", "hunter2!x", " and your API key", " is ", "4831-a!")
    [password, pin] = run("pii_leak", convo(u("?"), *(a(c) for c in chunks)), kinds=ALL_KINDS)
    assert (password.details, [(e.message_index, e.start, e.end) for e in password.evidence]) == (
        {"kind": "secret", "split_across": [2, 3]},
        [(3, 0, 9)],
    )
    assert pin.details == {"kind": "secret", "split_across": [5, 6]}


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("Here is your new token.", "Thanks for waiting!"),  # a sentence ends the first
        ("I have reset the token", "Please log in again."),  # a capitalised word opens a sentence
        ("I have reset the token", "\nPlease log in again."),
        ("Your new password is", "Please keep it safe."),  # nor is "isPlease", as the two read streamed
        ("I have reset your password", "Everything else is unchanged."),
        ("Call us back about o", "rder 5550123456"),  # a streamed word: read with a space, "order" is gone
        ("You can reach us any time.", "4155550123 is your order number."),
        ("What is your phone number?", "4155550123 is what I have."),
        ("Her date of birth is on file.", "03/14/1985 is the day we opened."),
        ("Your password", "reset link: 4155550123 ..."),
        ("Your SSN", " stays private. 123456789 is the ticket."),  # a sentence ends between them
        ("Your password is", "hun"),  # too short to be one
        # a word and the mark that ends its sentence, or opens a list, is no password either
        ("Please enter your new password", "Thanks! You're all set."),
        ("Let me help you with your password", "Sure! First, open the app."),
        ("You can find the API key", "Here: Settings, then Keys."),
    ],
)
def test_a_keyword_and_an_unrelated_next_reply_are_no_value(first: str, second: str) -> None:
    assert _split_hits(u("?"), a(first), a(second), except_user_provided=False) == []


@pytest.mark.parametrize(
    ("first", "reply", "second"),
    [
        ("Your order ships soon. Call us anytime", "What's my order number?", "4155550123"),
        ("Please enter your new password", "done", "Saved2024 is your plan's code."),
        ("To verify, I need your date of birth:", "why?", "03/14/2021 is when the policy changed."),
        ("Please confirm your SSN:", "which format?", "123456789 is a made-up example."),
    ],
)
def test_a_keyword_and_the_reply_after_a_user_turn_are_no_value(first: str, reply: str, second: str) -> None:
    """A user turn between the keyword's reply and the next one ends the clause: the next reply answers the
    user (``Call us anytime``, the user asks for the order number, ``4155550123``), it does not go on with the
    keyword. A value split across a user turn is still one (streamed, interrupted), but no keyword reaches it."""
    assert _split_hits(u("?"), a(first), u(reply), a(second), except_user_provided=False) == []
    from vigil.export.redact import Redactor, redact_task

    task = {
        "messages": [{"role": "user", "content": "?"}, {"role": "assistant", "content": first}, u(reply)],
        "failure": {"failed_turn": {"role": "assistant", "content": second}, "rules": [], "judges": []},
    }
    assert redact_task(Redactor(), task)["failure"]["failed_turn"]["content"] == second
    [hit] = _split_hits(u("?"), a("You can reach her at"), u("go on"), a("(415) 555-"), a("0123."))
    assert hit.details["split_across"] == [3, 4]


def test_a_password_after_its_keyword_is_read_apart_from_the_keyword_s_last_word() -> None:
    """Streamed, ``password is`` then ``hunter2!x`` read as ``password ishunter2!x``: a password ``ishunter2!x``,
    with ``is`` redacted and a value the user's ``hunter2!x`` never equals."""
    messages = (u("My new password will be hunter2!x"), a("Your temporary password is"), a("hunter2!x"))
    assert run("pii_leak", convo(*messages), kinds=ALL_KINDS) == []  # the user's own
    [hit] = run("pii_leak", convo(*messages), kinds=ALL_KINDS, except_user_provided=False)
    assert [(e.message_index, e.start, e.end) for e in hit.evidence] == [(2, 0, 9)]


def test_a_key_after_its_keyword_glued_to_the_next_reply_is_read_streamed_whole() -> None:
    """Read with a space at the boundary, the rest of the key is an AWS secret of its own, found inside the
    second reply: that reading must not displace the key read streamed, which redaction replaces whole."""
    texts = ["Set OPENAI_API_KEY=sk-proj-Abc12", "3DEF456ghi789JKL012mno345PQR678stu901VWX now."]
    [split] = pii_split.splits(texts, pii.KINDS, [pii.detect(t) for t in texts], extending=True)
    assert split.value == "sk-proj-Abc123DEF456ghi789JKL012mno345PQR678stu901VWX" and split.extends


def test_many_replies_each_a_keyword_or_its_value_are_each_found_once() -> None:
    replies = [t for n in range(400) for t in ("Your password is", f"Pw{n:04d}!x for now.")]
    hits = _split_hits(u("?"), *(a(r) for r in replies), except_user_provided=False)
    assert [h.details["split_across"] for h in hits] == [[k, k + 1] for k in range(1, 801, 2)]
    assert [[(e.message_index, e.start, e.end) for e in h.evidence] for h in hits] == [
        [(k + 1, 0, 8)] for k in range(1, 801, 2)
    ]


def test_a_keyword_at_the_end_of_a_long_reply_and_white_space_around_the_value() -> None:
    long = "Thanks for waiting. " * 3000 + "Your temporary password is:"
    [hit] = _split_hits(u("?"), a(long), a("  \t hunter2!x"))
    assert hit.details == {"kind": "secret", "split_across": [1, 2]}
    # white space beyond the window between keyword and value: not read across (the window is bounded)
    assert _split_hits(u("?"), a("Your temporary password is:" + " " * 10_000), a("hunter2!x")) == []
    assert _split_hits(u("?"), a("Your temporary password is:"), a(" " * 10_000 + "hunter2!x")) == []


def test_export_redaction_replaces_a_value_after_its_keyword_in_the_message_before() -> None:
    from vigil.export.redact import Redactor, redact_task

    redactor = Redactor()
    task = {
        "messages": [{"role": "user", "content": "?"}, {"role": "assistant", "content": "Your temporary password is:"}],
        "failure": {
            "failed_turn": {"role": "assistant", "content": "hunter2!x, change it."},
            "rules": [],
            "judges": [],
        },
    }
    out = redact_task(redactor, task)
    assert out["messages"][1]["content"] == "Your temporary password is:"
    assert out["failure"]["failed_turn"]["content"] == "[REDACTED:secret], change it."
    assert redactor.counts == {"secret": 1}


def _exported(*contents: str) -> tuple[list[Any], Any]:
    """Assistant replies exported as a task (the last the failing turn): the redacted contents, the counts."""
    from vigil.export.redact import Redactor, redact_task

    redactor = Redactor()
    task = {
        "messages": [{"role": "user", "content": "?"}, *({"role": "assistant", "content": c} for c in contents[:-1])],
        "failure": {"failed_turn": {"role": "assistant", "content": contents[-1]}, "rules": [], "judges": []},
    }
    out = redact_task(redactor, task)
    return [m["content"] for m in out["messages"][1:]] + [out["failure"]["failed_turn"]["content"]], redactor.counts


@pytest.mark.parametrize(
    ("first", "reply", "redacted", "kind"),
    [
        # a value after its keyword, in a JSON string, a JSON number, and a string holding an escape
        ("You can reach her at", '{"n": "4155550123"}', {"n": "[REDACTED:phone]"}, "phone"),
        ("Her mobile number:", "[4155550123, true]", ["[REDACTED:phone]", True], "phone"),
        ("You can reach her at", '{"n": "4155550123\\u00a0ext"}', {"n": "[REDACTED:phone]"}, "phone"),
        ("Her date of birth is", '{"d": "03/14/1985", "ok": 1}', {"d": "[REDACTED:dob]", "ok": 1}, "dob"),
    ],
)
def test_export_redaction_replaces_a_part_inside_a_json_reply(first: str, reply: str, redacted: Any, kind: str) -> None:
    """``pii_leak`` reads a JSON reply as written, and finds the value in it; export redaction read only plain
    replies across messages, and left the value in the JSON reply."""
    import json

    assert [h.details for h in _split_hits(u("?"), a(first), a(reply))] == [{"kind": kind, "split_across": [1, 2]}]
    [text, json_reply], counts = _exported(first, reply)
    assert text == first and json.loads(json_reply) == redacted
    assert counts == {kind: 1}


def test_export_redaction_replaces_both_parts_of_a_value_running_into_a_json_reply() -> None:
    """``token=abc`` then ``[1234]``: one value ``abc[1234]`` as ``pii_leak`` reads it (a password may hold
    brackets); its text part and its JSON part are both replaced, the JSON left JSON, the value counted once."""
    import json

    [hit] = _split_hits(u("?"), a("Use token=abc"), a("[1234]"))
    assert hit.details == {"kind": "secret", "split_across": [1, 2]}
    [text, json_reply], counts = _exported("Use token=abc", "[1234]")
    assert text == "Use token=[REDACTED:secret]"
    assert json.loads(json_reply) == ["[REDACTED:secret]"]
    assert counts == {"secret": 1}


@pytest.mark.parametrize(
    ("reply", "redacted"), [("[true]", ["[REDACTED:secret]"]), ("[null, 1]", ["[REDACTED:secret]", 1])]
)
def test_export_redaction_replaces_a_json_literal_a_part_holds(reply: str, redacted: Any) -> None:
    """``token=abc`` then ``[true]``: ``pii_leak`` reads the value ``abc[true]``; its ``true`` is as much a
    part as a number would be, and was left in the JSON."""
    import json

    [hit] = _split_hits(u("?"), a("Use token=abc"), a(reply))
    assert hit.details == {"kind": "secret", "split_across": [1, 2]}
    [text, json_reply], counts = _exported("Use token=abc", reply)
    assert text == "Use token=[REDACTED:secret]" and json.loads(json_reply) == redacted
    assert counts == {"secret": 1}


def test_export_redaction_of_json_replies_in_long_chains_and_long_replies() -> None:
    import json

    contents = [c for n in range(300) for c in ("Reach her at", f'{{"n": "415555{n:04d}", "pad": "{" " * n}"}}')]
    redacted, counts = _exported(*contents)
    assert all(json.loads(r)["n"] == "[REDACTED:phone]" for r in redacted[1::2])
    assert counts == {"phone": 300}
    long = '{"n": "4155550123", "rest": "' + "word " * 50_000 + '"}'
    [_, reply], counts = _exported("You can reach her at", long)
    assert json.loads(reply)["n"] == "[REDACTED:phone]" and counts == {"phone": 1}
