"""A read-only index over one conversation, built once and shared by every rule."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import orjson

from vigil.schema import Conversation, Message, ToolCall, loads_exact


@dataclass(frozen=True, slots=True)
class CallSite:
    message_index: int
    call: ToolCall

    @property
    def name(self) -> str:
        return self.call.function.name

    @property
    def args(self) -> dict[str, Any]:
        return self.call.args


@dataclass(slots=True)
class ToolResult:
    message_index: int
    message: Message
    _parsed: Any = None
    _done: bool = False

    @property
    def is_error(self) -> bool:
        return self.message.is_error

    def parsed(self) -> Any:
        """The result's content as JSON where it is JSON, else None."""
        if not self._done:
            self._done = True
            text = self.message.text
            if text[:1] in ("{", "["):
                try:
                    self._parsed = loads_exact(text)
                except orjson.JSONDecodeError:
                    self._parsed = None
        return self._parsed


# A word of the text pass: what is left between runs of characters that are neither word characters nor '#'.
_NON_WORD = re.compile(r"[^#\w]+")
# Texts this long (system prompts, policies) recur across the conversations of an agent: their words
# are kept, a bounded number of them, so every conversation that repeats one reuses its pass.
_SHARED_TEXT_CHARS = 2048


def _words(text: str) -> frozenset[str]:
    words = set(_NON_WORD.split(text))
    words |= {w.lstrip("#") for w in words if w.startswith("#")}
    return frozenset(words)


_shared_words = lru_cache(maxsize=64)(_words)


class ConversationView:
    """The text pass every rule shares: each message's text and its words, computed once per conversation
    (and, for long recurring texts, once per process)."""

    __slots__ = ("conversation", "messages", "tool_calls", "results", "_words", "_lower", "__dict__")

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.messages = conversation.messages
        self.tool_calls: list[CallSite] = []
        self.results: dict[str, ToolResult] = {}
        self._words: dict[int, frozenset[str]] = {}
        self._lower: dict[int, str] = {}
        for i, m in enumerate(self.messages):
            if m.tool_calls and m.role == "assistant":
                for call in m.tool_calls:
                    self.tool_calls.append(CallSite(i, call))
            elif m.role == "tool" and m.tool_call_id:
                self.results[m.tool_call_id] = ToolResult(i, m)

    def result_for(self, site: CallSite) -> ToolResult | None:
        return self.results.get(site.call.id) if site.call.id else None

    @cached_property
    def texts(self) -> list[str]:
        """Each message's text (``Message.text`` joins content parts anew on every call)."""
        return [m.text for m in self.messages]

    def words(self, i: int) -> frozenset[str]:
        """The words of message ``i`` (split on non-word characters; a ``#W123`` also as ``W123``)."""
        found = self._words.get(i)
        if found is None:
            text = self.texts[i]
            found = self._words[i] = _shared_words(text) if len(text) >= _SHARED_TEXT_CHARS else _words(text)
        return found

    def lower(self, i: int) -> str:
        """Message ``i``'s text in lower case."""
        found = self._lower.get(i)
        if found is None:
            found = self._lower[i] = self.texts[i].lower()
        return found

    def words_of(self, indexes: Iterable[int]) -> Iterator[frozenset[str]]:
        return (self.words(i) for i in indexes)

    @cached_property
    def user_turns(self) -> list[tuple[int, str]]:
        texts = self.texts
        return [(i, texts[i]) for i, m in enumerate(self.messages) if m.role == "user"]

    @cached_property
    def assistant_texts(self) -> list[tuple[int, str]]:
        texts = self.texts
        return [(i, t) for i, m in enumerate(self.messages) if m.role == "assistant" and (t := texts[i])]

    @cached_property
    def tool_result_texts(self) -> list[tuple[int, str]]:
        texts = self.texts
        return [(i, texts[i]) for i, m in enumerate(self.messages) if m.role == "tool"]
