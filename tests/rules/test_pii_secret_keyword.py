"""A password or token after its keyword, and what is not one: a noun after the keyword that makes it another
thing (``password strength:``, ``token balance:``), with an ordinary word or a number for its value, and a
capitalised word that opens an instruction (``password: Open Settings``). In one reply and split across two."""

from __future__ import annotations

from typing import Any

import pytest

from tests.rules.test_rules_builtin import a, convo, run, u
from vigil.rules import pii

ALL_KINDS = list(pii.KINDS)

# What a support agent writes in an ordinary reply.
NOT_SECRETS = [
    "Here's how to change your password: Open Settings, then Security.",
    "Your password strength: strong",
    "Your token balance: 1500",
    "API key rotation: enabled",
    "secret question: What was your first pet's name?",
    "password reset link: sent",
    "Your access token expires in 3600 seconds",
    "Password Strength: Strong",
    "Token Balance = 1500",
    "Your password requirements: 12 characters or more.",
    "Use a password manager: Bitwarden works well.",
    "Password: Required for all accounts.",
    "Your password: Hidden for your security.",
    # an instruction: a capitalised word that another follows, or a verb that opens one, whatever comes next
    "To change your password: Open Settings and tap Reset.",
    "To reset your password: Click on Forgot password.",
    "Your password: Navigate to Settings, then Security.",
    "To change your passcode: Head to Settings and tap Face ID.",
    "Forgot your password: Select Reset and follow the link.",
    # a word that tells the state of the password or key, ending the sentence, or a mask in its place
    "password: Required.",
    "Your password: Expired",
    "Your password is Incorrect, please try again.",
    "Your password: Updated",
    "token: expired",
    "API key: Enabled",
    "Your API key: Revoked",
    "Secret: None",
    "Password: ********",
    # a number after a code that is no secret, or not a code's digits
    "error code: 404",
    "Your order code: 48392011",
    "The zip code: 94107",
    "reset code: sent",
    "Your verification code expires in 10 minutes.",
    "verification code: 123",
    "security code: 12345678901",
    "Your reset code: 2024-05-15",
    "The security code is 1.5 inches tall.",
    # a time or a quantity after a code's words: its number measures something
    "Your verification code is sent at 1030 am.",
    "Your verification code is 1030 am",
    "Your OTP code is 1030 seconds old",
    "Your sign-in code is 2030 minutes away",
    "verification code: 1440 mins",
    "security code: 1000 times",
]

# Real leaks: (text, the value reported).
SECRETS = [
    ("password: hunter2!", "hunter2!"),
    ("DB_PASSWORD=s3cr3t", "s3cr3t"),
    ("the admin password is 'x9$Lq'", "x9$Lq"),
    ("your temporary password is Tr0ub4dor&3", "Tr0ub4dor&3"),
    ("your temporary password is: hunter2!x", "hunter2!x"),
    ("token: ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"),
    ("api_key=sk-abcdefghijklmnopqrstuvwx", "sk-abcdefghijklmnopqrstuvwx"),
    ("Your password: Welcome1", "Welcome1"),
    ("Your new password: Sunshine.", "Sunshine"),  # a capitalised word that no word follows
    ("The password is Open", "Open"),
    # after a keyword written out, a capitalised word mid-sentence is the value, whatever follows it
    ("The Wi-Fi password is Sunshine for guests.", "Sunshine"),
    ("Your password is Fluffy and your PIN is 1234", "Fluffy"),
    # a capitalised word after "password:" that a lowercase word carrying on the sentence follows
    ("Your password: Sunshine and your username: bob", "Sunshine"),
    ("Passcode: Dolphins for the guest network.", "Dolphins"),
    ("The temporary password: Marigold to sign in, then change it.", "Marigold"),
    # the digits of a one-time code, after what the code is for
    ("reset code: 483920", "483920"),
    ("Your password reset code: 483920", "483920"),
    ("Your verification code is 4839.", "4839"),
    ("One-time PIN: 29384756", "29384756"),
    ("Your OTP: 592011", "592011"),
    ("security code = 1234567890", "1234567890"),
    ("password: strong", "strong"),  # after the keyword itself, a lowercase word is a password
    # after a noun that qualifies the keyword, a value with a secret's shape is still one
    ("Your API key value: 9f8a7b6c5d4e", "9f8a7b6c5d4e"),
    ("Password hint: Tr0ub4dor&3", "Tr0ub4dor&3"),
]


def _values(text: str) -> list[str]:
    return [pii.value_of(f, text) for f in pii.detect(text, ["secret"])]


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_a_keyword_qualifying_another_noun_or_opening_an_instruction_is_no_secret(text: str) -> None:
    assert _values(text) == []
    assert run("pii_leak", convo(u("How do I manage my account?"), a(text)), kinds=ALL_KINDS) == []


@pytest.mark.parametrize(("text", "value"), SECRETS)
def test_a_value_after_its_keyword_is_still_a_secret(text: str, value: str) -> None:
    assert _values(text) == [value]


def _cuts(text: str) -> list[tuple[str, str]]:
    """``text`` cut in two at every space, the space ending the first part or opening the second."""
    return [(text[:i], text[i:]) for i, c in enumerate(text) if c == " "] + [
        (text[: i + 1], text[i + 1 :]) for i, c in enumerate(text) if c == " "
    ]


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_split_across_two_replies_they_are_no_secret_either(text: str) -> None:
    # A cut after the word that follows the keyword leaves a first reply that alone reads as a keyword and its
    # value (``password: Open``, ``Token Balance``): each reply is read alone, and that one is not checked here.
    cuts = [(first, second) for first, second in _cuts(text) if not pii.detect(first, ["secret"])]
    keyworded = ("password", "token", "code")
    assert any(first.rstrip().endswith(":") or first.lower().endswith(keyworded) for first, _ in cuts)
    for first, second in cuts:
        hits = run("pii_leak", convo(u("?"), a(first), a(second)), kinds=ALL_KINDS, except_user_provided=False)
        assert hits == [], (first, second)


@pytest.mark.parametrize(
    ("first", "second", "value"),
    [
        ("Your temporary password is", "Tr0ub4dor&3", "Tr0ub4dor&3"),
        ("The admin password:", "x9$Lq2", "x9$Lq2"),
        ("Your API key value:", "9f8a7b6c5d4e", "9f8a7b6c5d4e"),
        ("Your new password:", "Welcome1 then log in.", "Welcome1"),
        ("Your password:", " Sunshine and your username: bob", "Sunshine"),
        ("Your pass", "word: Sunshine and your username: bob", "Sunshine"),  # the label in the second reply
        ("Your reset code:", " 483920", "483920"),
        ("Your verification code is", "483920.", "483920"),
    ],
)
def test_split_across_two_replies_a_real_leak_is_still_found(first: str, second: str, value: str) -> None:
    hits = run("pii_leak", convo(u("?"), a(first), a(second)), kinds=ALL_KINDS, except_user_provided=False)
    assert [(h.details["kind"], second[h.evidence[0].start : h.evidence[0].end]) for h in hits] == [("secret", value)]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("Here's how to change your password: Open", " Settings and tap Reset"),
        ("Here's how to change your password: Open ", "Settings and tap Reset"),
        ("To reset your password: Click", " on Forgot password."),
    ],
)
def test_a_reply_cut_after_the_word_its_keyword_labels_reads_on_into_the_next(first: str, second: str) -> None:
    assert _values(first)  # alone, the first reply ends with a password after its keyword
    hits = run("pii_leak", convo(u("?"), a(first), a(second)), kinds=ALL_KINDS, except_user_provided=False)
    assert hits == []


TOOL_RESULT = {"role": "tool", "tool_call_id": "c1", "content": "{}"}


@pytest.mark.parametrize(
    "messages",
    [
        [a("Your password: Sunshine"), a(" and your username: bob")],  # the next reply carries the sentence on
        [a("Your password: Open"), u("and then?"), a("Settings and tap Reset")],  # the next answers the user
        [a("Your password: Open"), TOOL_RESULT, a(" Settings and tap Reset")],  # a tool result ends the chain
    ],
)
def test_a_password_ending_a_reply_stays_one_unless_the_next_goes_on_with_it(messages: list[dict[str, Any]]) -> None:
    hits = run("pii_leak", convo(u("?"), *messages), kinds=ALL_KINDS, except_user_provided=False)
    assert [(h.details["kind"], h.evidence[0].message_index) for h in hits] == [("secret", 1)]
