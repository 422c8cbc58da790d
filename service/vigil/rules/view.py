"""A read-only index over one conversation, built once and shared by every rule."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson

from vigil.schema import Conversation, Message, ToolCall


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
                    self._parsed = orjson.loads(text)
                except orjson.JSONDecodeError:
                    self._parsed = None
        return self._parsed


class ConversationView:
    __slots__ = ("conversation", "messages", "tool_calls", "results", "__dict__")

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.messages = conversation.messages
        self.tool_calls: list[CallSite] = []
        self.results: dict[str, ToolResult] = {}
        for i, m in enumerate(self.messages):
            if m.tool_calls and m.role == "assistant":
                for call in m.tool_calls:
                    self.tool_calls.append(CallSite(i, call))
            elif m.role == "tool" and m.tool_call_id:
                self.results[m.tool_call_id] = ToolResult(i, m)

    def result_for(self, site: CallSite) -> ToolResult | None:
        return self.results.get(site.call.id) if site.call.id else None

    @cached_property
    def user_turns(self) -> list[tuple[int, str]]:
        return [(i, m.text) for i, m in enumerate(self.messages) if m.role == "user"]

    @cached_property
    def assistant_texts(self) -> list[tuple[int, str]]:
        return [(i, t) for i, m in enumerate(self.messages) if m.role == "assistant" and (t := m.text)]

    @cached_property
    def tool_result_texts(self) -> list[tuple[int, str]]:
        return [(i, m.text) for i, m in enumerate(self.messages) if m.role == "tool"]
