"""The text pass rules share: each message's words and lower case once per conversation, a long
recurring text's words once per process, with the same answers as splitting the texts anew."""

from __future__ import annotations

import re

from vigil.rules.view import ConversationView
from vigil.schema import Conversation

POLICY = "You are an airline agent. " + " ".join(f"Rule {k}: refund order #W{k:07d} within 24h." for k in range(200))


def _conv(cid: str, user: str) -> Conversation:
    return Conversation.model_validate(
        {
            "conversation_id": cid,
            "agent_id": "a",
            "agent_version": "v1",
            "messages": [
                {"role": "system", "content": POLICY},
                {"role": "user", "content": [{"type": "text", "text": user}, {"type": "text", "text": "Thanks"}]},
            ],
        }
    )


def test_words_match_a_fresh_split_and_long_texts_are_split_once() -> None:
    a, b = ConversationView(_conv("a", "Order #W0000042 please")), ConversationView(_conv("b", "Hi"))
    fresh = set(re.split(r"[^#\w]+", POLICY))
    assert a.words(0) == fresh | {w.lstrip("#") for w in fresh if w.startswith("#")}
    assert "W0000007" in a.words(0) and "#W0000007" in a.words(0)
    assert a.words(0) is b.words(0)  # the second conversation reuses the first one's pass
    assert a.words(1) >= {"Order", "#W0000042", "W0000042", "please", "Thanks"}
    assert a.texts[1] == "Order #W0000042 please\nThanks" and a.lower(1) == "order #w0000042 please\nthanks"
    assert a.texts[1] is a.texts[1]
