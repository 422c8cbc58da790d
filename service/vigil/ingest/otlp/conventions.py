"""What one span says, in whichever convention its instrumentation speaks, as one :class:`SpanView`.

- OpenTelemetry GenAI semantic conventions (``opentelemetry-instrumentation-openai-v2``, OpenLLMetry /
  traceloop, and others): ``gen_ai.input.messages`` / ``gen_ai.output.messages`` /
  ``gen_ai.system_instructions`` (attributes of the span or of a span event or joined log record), the
  older ``gen_ai.content.prompt`` / ``gen_ai.content.completion`` events, the per-message events
  (``gen_ai.user.message`` ...), flattened ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*``, tool
  execution spans (``gen_ai.operation.name=execute_tool``) and ``gen_ai.tool.definitions``;
- OpenInference (Arize Phoenix, LlamaIndex, DSPy ...): ``openinference.span.kind`` (``LLM``, ``TOOL``,
  ``AGENT``, ``CHAIN``), ``llm.input_messages.N.message.*`` / ``llm.output_messages.N.message.*``,
  ``llm.token_count.*``, ``llm.tools.N.tool.json_schema``, ``tool.name`` with ``input.value`` /
  ``output.value``;
- Langfuse: ``langfuse.observation.type`` (``generation``, ``tool``, ``agent`` ...) with
  ``langfuse.observation.input`` / ``output`` / ``model.name`` / ``usage_details`` / ``level``;
- OpenLLMetry workflow spans: ``traceloop.span.kind`` (``workflow``, ``task``, ``agent``, ``tool``) with
  ``traceloop.entity.name`` / ``input`` / ``output``.

A span with none of these is a container (the root HTTP or application span) or nothing at all.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vigil.ingest.otlp.messages import as_text, call, json_value, to_messages, tool_definitions, tool_name
from vigil.ingest.otlp.otlp import EXTENDS
from vigil.schema import MAX_INT

INFERENCE_OPS = {"chat", "text_completion", "generate_content"}
MESSAGE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
STATUS_ERROR = 2
PREFIXES = ("gen_ai.", "llm.", "openinference.", "langfuse.", "traceloop.")
# An index in an attribute name (``gen_ai.prompt.3.role``) is a plain decimal of at most this many digits;
# an attribute with any other (``x``, ``-1``, a number of thousands of digits) is not read.
INDEX_DIGITS = 6
_N = f"([0-9]{{1,{INDEX_DIGITS}}})"
_FLAT = re.compile(rf"^gen_ai\.(prompt|completion)\.{_N}\.(.+)$")
_OI_MESSAGE = re.compile(rf"^llm\.(input|output)_messages\.{_N}\.message\.(.+)$")
_OI_TOOL = re.compile(rf"^llm\.tools\.{_N}\.tool\.json_schema$")
_INDEX = re.compile(_N)
SESSION_KEYS = ("session.id", "langfuse.session.id", "traceloop.association.properties.session_id")
USER_KEYS = ("user.id", "langfuse.user.id", "traceloop.association.properties.user_id", "enduser.id")


@dataclass(slots=True)
class ToolRun:
    """A tool execution span: the call it answers (id may be unknown) and its result."""

    call_id: str | None
    name: str
    arguments: Any
    result: Any
    failed: bool
    error: str = ""

    def __post_init__(self) -> None:
        self.name = tool_name(self.name)


@dataclass(slots=True)
class SpanView:
    role: str = "other"  # inference | tool | container | other
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    system: list[str] = field(default_factory=list)
    tool: ToolRun | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    convention: str = ""


class SystemTexts:
    """The converted text of the latest system instructions seen, in every conversation: an agent's
    instructions (often a policy of many kilobytes, as JSON) are the same in all its conversations, and
    are parsed once instead of once per conversation (about 50 µs for τ²'s 15 kB policies).

    A value is looked up by its length and ends, then compared whole (a few µs): hashing the whole
    string, as a dict keyed by it would, costs half what parsing it does. At most :attr:`MAX_VALUES`
    values of at most :attr:`MAX_CHARS` characters in all; the oldest go first. The lists returned are
    shared: read only."""

    MAX_VALUES = 64
    MAX_CHARS = 4 * 1024 * 1024
    ENDS = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._texts: OrderedDict[tuple[int, str, str], tuple[str, list[str]]] = OrderedDict()
        self._chars = 0

    def texts(self, raw: Any) -> list[str]:
        if not isinstance(raw, str) or len(raw) > self.MAX_CHARS // 4:
            return [as_text(json_value(raw))]
        key = (len(raw), raw[: self.ENDS], raw[-self.ENDS :])
        with self._lock:
            known = self._texts.get(key)
            if known is not None and (known[0] is raw or known[0] == raw):
                self._texts.move_to_end(key)
                return known[1]
        texts = [as_text(json_value(raw))]
        with self._lock:
            replaced = self._texts.pop(key, None)
            if replaced is not None:
                self._chars -= len(replaced[0])
            self._texts[key] = (raw, texts)
            self._chars += len(raw)
            while len(self._texts) > self.MAX_VALUES or self._chars > self.MAX_CHARS:
                _, (old, _) = self._texts.popitem(last=False)
                self._chars -= len(old)
        return texts


SYSTEM_TEXTS = SystemTexts()


class InputCache:
    """Spans of one conversation resend its history: the JSON of a span's input messages usually starts
    with the previous span's. The messages (and merge keys) of that shared prefix are reused instead of
    parsed and converted again, so assembling stays linear in the conversation's length."""

    def __init__(self) -> None:
        self.raw = ""
        self.messages: list[dict[str, Any]] = []
        self.filtered: list[dict[str, Any]] = []  # the messages but system ones
        self.keys: list[tuple[Any, ...]] = []
        self._keyed = 0  # how many of ``filtered`` have keys
        self._system_raw: Any = None
        self._out_raw = ""  # the previous span's output messages, as received and converted
        self._out: list[dict[str, Any]] = []
        self._system: list[str] = []

    def messages_of(self, raw: Any, base: Any = None) -> list[dict[str, Any]]:
        """``base``: the string the parser found ``raw`` extends (see ``EXTENDS``), if any."""
        if not isinstance(raw, str) or not raw.startswith("["):
            return to_messages(raw, "user")
        prev = self.raw
        if raw is prev:  # the same string (see compact): the same messages
            return self.messages
        n = len(prev) - 1
        if base is prev and prev:  # it extends this very string: no need to compare them
            new = self._extension(raw[n:])
            self._remember(raw, self.messages + new, new)
            return self.messages
        if prev and len(raw) > n and raw[n] in ",]" and raw.startswith(prev[:-1]):
            rest = raw[len(prev) - 1 :]
            if rest.rstrip() == "]":
                return self.messages
            if rest.startswith(","):
                new = self._extension(rest)
                self._remember(raw, self.messages + new, new)
                return self.messages
        msgs = to_messages(raw, "user")
        self.filtered, self.keys, self._keyed = [], [], 0
        self._remember(raw, msgs, msgs)
        return msgs

    def outputs_of(self, raw: Any) -> list[dict[str, Any]]:
        """A span's output messages, kept: the next span's input usually resends them first."""
        out = to_messages(raw, "assistant")
        self._out_raw, self._out = (raw, out) if isinstance(raw, str) and raw.startswith("[") else ("", [])
        return out

    def _extension(self, rest: str) -> list[dict[str, Any]]:
        """The messages of ``rest`` (``,`` and the items an input adds, then ``]``); the previous span's output
        items it starts with are not parsed again (complete JSON values followed by ``,`` or ``]``)."""
        items = self._out_raw[1:-1]
        end = len(items) + 1
        if items.strip() and len(rest) > end and rest[end] in ",]" and rest.startswith(items, 1):
            if rest[end] == "]":
                return list(self._out) if not rest[end + 1 :].strip() else to_messages(json_value("[" + rest[1:]))
            return self._out + to_messages(json_value("[" + rest[end + 1 :]))
        return to_messages(json_value("[" + rest[1:]))

    def _remember(self, raw: str, messages: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
        self.raw, self.messages = raw, messages
        self.filtered = self.filtered + [m for m in new if m["role"] != "system"]

    def system_texts(self, raw: Any) -> list[str]:
        """System instructions (every span resends the same ones): converted once per distinct value, in
        this conversation and, through :data:`SYSTEM_TEXTS`, across the conversations of one agent."""
        if raw is not self._system_raw and raw != self._system_raw:
            self._system_raw, self._system = raw, SYSTEM_TEXTS.texts(raw)
        return self._system

    def keyed(self, msgs: list[dict[str, Any]], key: Any) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
        """``msgs`` without system messages, with their merge keys (cached for the last messages seen)."""
        if msgs is not self.messages:
            filtered = [m for m in msgs if m["role"] != "system"]
            return filtered, [key(m) for m in filtered]
        if self._keyed < len(self.filtered):
            self.keys = self.keys[: self._keyed] + [key(m) for m in self.filtered[self._keyed :]]
            self._keyed = len(self.filtered)
        return self.filtered, self.keys


def is_relevant(span: dict[str, Any]) -> bool:
    """Whether a span is kept: it speaks one of the conventions above, or it is a trace's root (container)."""
    if not span.get("parent_span_id"):
        return True
    if any(k.startswith(PREFIXES) for k in span["attributes"]):
        return True
    return any(
        e["name"].startswith("gen_ai.") or any(k.startswith("gen_ai.") for k in e["attributes"]) for e in span["events"]
    )


_LABEL_KEYS = frozenset(SESSION_KEYS + USER_KEYS)
_NO_BASES: dict[str, str] = {}


def session_and_user(spans: Iterable[dict[str, Any]]) -> tuple[str | None, str | None]:
    """The session and user ids of a conversation: each from the first span carrying it (most carry neither,
    which one set lookup tells)."""
    session = user = None
    for s in spans:
        if _LABEL_KEYS.isdisjoint(s["attributes"]):
            continue
        session = session or first_attr(s, SESSION_KEYS)
        user = user or first_attr(s, USER_KEYS)
        if session and user:
            break
    return session, user


def first_attr(span: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    a = span["attributes"]
    for k in keys:
        v = a.get(k)
        if v not in (None, ""):
            return str(v)[:256]
    return None


def view(span: dict[str, Any], cache: InputCache | None = None) -> SpanView:
    a = span["attributes"]
    if "openinference.span.kind" in a:
        return _openinference(span)
    if "langfuse.observation.type" in a:
        return _langfuse(span)
    if a.get("traceloop.span.kind") in ("tool", "workflow", "task", "agent") and not _has_genai_messages(span):
        return _traceloop(span)
    return _genai(span, cache or InputCache())


def _int(v: Any) -> int:
    """0 unless a whole number (an infinite double, a string of thousands of digits ... are 0)."""
    try:
        return int(v or 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def _tokens(v: Any) -> int:
    """A token count: a whole number from 0 to what a database BIGINT holds."""
    return max(0, min(_int(v), MAX_INT))


def _index(text: str) -> int | None:
    """The index a part of an attribute name gives (see ``INDEX_DIGITS``), or None."""
    return int(text) if _INDEX.fullmatch(text) else None


def _failed(span: dict[str, Any]) -> bool:
    return span["status"]["code"] == STATUS_ERROR or bool(span["attributes"].get("error.type"))


# --- OpenTelemetry GenAI ------------------------------------------------------------------------------


def _attr(span: dict[str, Any], key: str) -> Any:
    if key in span["attributes"]:
        return span["attributes"][key]
    for ev in span["events"]:
        if key in ev["attributes"]:
            return ev["attributes"][key]
    return None


def _has_genai_messages(span: dict[str, Any]) -> bool:
    return any(
        k.startswith(("gen_ai.input.", "gen_ai.output.", "gen_ai.prompt", "gen_ai.completion"))
        for k in span["attributes"]
    )


def _event_messages(span: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    inputs: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    for ev in span["events"]:
        a = ev["attributes"]
        if ev["name"] in MESSAGE_EVENTS:
            item = {
                "role": a.get("role") or MESSAGE_EVENTS[ev["name"]],
                "content": json_value(a.get("content")),
                "tool_calls": a.get("tool_calls"),
                "tool_call_id": a.get("id") or a.get("tool_call_id"),
            }
            inputs.extend(to_messages([item]))
        elif ev["name"] == "gen_ai.choice" and _int(a.get("index", 0)) == 0:
            message = json_value(a.get("message"))
            item = (
                message
                if isinstance(message, dict)
                else {"content": a.get("content"), "tool_calls": a.get("tool_calls")}
            )
            outputs.extend(to_messages([{"role": "assistant", **item}]))
    return inputs, outputs


def _flat_messages(span: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    by_index: dict[int, dict[str, Any]] = {}
    for key, value in span["attributes"].items():
        m = _FLAT.match(key)
        if not m or m.group(1) != kind:
            continue
        entry = by_index.setdefault(int(m.group(2)), {})
        path = m.group(3).split(".")
        if path[0] == "tool_calls" and len(path) == 3:
            n = _index(path[1])
            if n is not None:
                entry.setdefault("_calls", {}).setdefault(n, {})[path[2]] = value
        else:
            entry[path[0]] = value
    items = []
    for i in sorted(by_index):
        if kind == "completion" and i > 0:
            break
        e = by_index[i]
        calls = [
            {"id": c.get("id"), "function": {"name": c.get("name"), "arguments": c.get("arguments")}}
            for _, c in sorted(e.pop("_calls", {}).items())
        ]
        items.append({**e, "tool_calls": calls or None})
    return to_messages(items)


def _genai(span: dict[str, Any], cache: InputCache) -> SpanView:
    a = span["attributes"]
    out = SpanView(convention="genai")
    op = a.get("gen_ai.operation.name")
    if not isinstance(op, str):  # a list or key-value list is no operation's name (nor hashable)
        op = None
    if op == "execute_tool":
        out.role = "tool"
        failed = _failed(span)
        out.tool = ToolRun(
            _str_or_none(a.get("gen_ai.tool.call.id")),
            str(a.get("gen_ai.tool.name") or span["name"].removeprefix("execute_tool ") or "unknown_tool"),
            a.get("gen_ai.tool.call.arguments"),
            a.get("gen_ai.tool.call.result"),
            failed,
            span["status"]["message"] if failed else "",
        )
        return out
    system = _attr(span, "gen_ai.system_instructions")
    if system not in (None, "", "[]"):
        out.system = cache.system_texts(system)
    raw_in, raw_out = _attr(span, "gen_ai.input.messages"), _attr(span, "gen_ai.output.messages")
    if raw_in is None and raw_out is None:
        raw_in, raw_out = _attr(span, "gen_ai.prompt"), _attr(span, "gen_ai.completion")
    base = (
        (span.get(EXTENDS) or _NO_BASES).get("gen_ai.input.messages")
        if raw_in is a.get("gen_ai.input.messages")
        else None
    )
    out.inputs, out.outputs = cache.messages_of(raw_in, base), cache.outputs_of(raw_out)
    if not out.inputs and not out.outputs:
        out.inputs, out.outputs = _event_messages(span)
    if not out.inputs and not out.outputs:
        out.inputs, out.outputs = _flat_messages(span, "prompt"), _flat_messages(span, "completion")
    out.tools = tool_definitions(_attr(span, "gen_ai.tool.definitions"))
    if op in INFERENCE_OPS or out.inputs or out.outputs or out.system:
        out.role = "inference"
        out.prompt_tokens = _tokens(a.get("gen_ai.usage.input_tokens") or a.get("gen_ai.usage.prompt_tokens"))
        out.completion_tokens = _tokens(a.get("gen_ai.usage.output_tokens") or a.get("gen_ai.usage.completion_tokens"))
        out.model = _str_or_none(a.get("gen_ai.response.model") or a.get("gen_ai.request.model"))
    elif op in ("invoke_agent", "create_agent") or a.get("traceloop.span.kind"):
        out.role = "container"
    return out


def _str_or_none(v: Any) -> str | None:
    return str(v) if v not in (None, "") else None


# --- OpenInference --------------------------------------------------------------------------------


def _oi_messages(a: dict[str, Any], direction: str) -> list[dict[str, Any]]:
    by_index: dict[int, dict[str, Any]] = {}
    for key, value in a.items():
        m = _OI_MESSAGE.match(key)
        if not m or m.group(1) != direction:
            continue
        entry = by_index.setdefault(int(m.group(2)), {})
        path = m.group(3)
        if path.startswith("tool_calls."):
            idx, _, rest = path[len("tool_calls.") :].partition(".")
            n = _index(idx)
            if n is not None:
                entry.setdefault("_calls", {}).setdefault(n, {})[rest.removeprefix("tool_call.")] = value
        elif path.startswith("contents."):
            idx, _, rest = path[len("contents.") :].partition(".")
            n = _index(idx)
            if rest == "message_content.text" and n is not None:
                entry.setdefault("_texts", {})[n] = value
        else:
            entry[path] = value
    items = []
    for i in sorted(by_index):
        e = by_index[i]
        calls = [
            {"id": c.get("id"), "function": {"name": c.get("function.name"), "arguments": c.get("function.arguments")}}
            for _, c in sorted(e.pop("_calls", {}).items())
        ]
        texts = [t for _, t in sorted(e.pop("_texts", {}).items())]
        content = e.get("content")
        if content is None and texts:
            content = "\n".join(str(t) for t in texts)
        items.append(
            {
                "role": e.get("role") or ("assistant" if direction == "output" else "user"),
                "content": content,
                "tool_calls": calls or None,
                "tool_call_id": e.get("tool_call_id"),
                "name": e.get("name"),
            }
        )
    return to_messages(items)


def _openinference(span: dict[str, Any]) -> SpanView:
    a = span["attributes"]
    kind = str(a.get("openinference.span.kind") or "").upper()
    out = SpanView(convention="openinference")
    if kind == "TOOL":
        out.role = "tool"
        failed = _failed(span)
        out.tool = ToolRun(
            _str_or_none(a.get("tool_call.id")),
            str(a.get("tool.name") or span["name"]),
            json_value(a.get("input.value")),
            a.get("output.value"),
            failed,
            span["status"]["message"] if failed else "",
        )
        return out
    if kind != "LLM":
        out.role = "container"
        return out
    out.role = "inference"
    out.inputs, out.outputs = _oi_messages(a, "input"), _oi_messages(a, "output")
    if not out.inputs:  # messages only in the raw request body
        body = json_value(a.get("input.value"))
        if isinstance(body, dict):
            out.inputs = to_messages(body.get("messages"))
    out.prompt_tokens = _tokens(a.get("llm.token_count.prompt"))
    out.completion_tokens = _tokens(a.get("llm.token_count.completion"))
    out.model = _str_or_none(a.get("llm.model_name"))
    schemas = sorted((int(m.group(1)), v) for k, v in a.items() if (m := _OI_TOOL.match(k)))
    out.tools = tool_definitions([v for _, v in schemas])
    return out


# --- Langfuse ---------------------------------------------------------------------------------------


def _langfuse(span: dict[str, Any]) -> SpanView:
    a = span["attributes"]
    kind = str(a.get("langfuse.observation.type") or "span").lower()
    out = SpanView(convention="langfuse")
    failed = _failed(span) or str(a.get("langfuse.observation.level") or "").upper() == "ERROR"
    error = str(a.get("langfuse.observation.status_message") or span["status"]["message"] or "")
    raw_in = json_value(a.get("langfuse.observation.input"))
    raw_out = json_value(a.get("langfuse.observation.output"))
    if kind == "tool":
        out.role = "tool"
        out.tool = ToolRun(None, span["name"], raw_in, raw_out, failed, error if failed else "")
        return out
    if kind != "generation":
        out.role = "container"
        return out
    out.role = "inference"
    if isinstance(raw_in, dict):
        out.tools = tool_definitions(raw_in.get("tools"))
        raw_in = raw_in.get("messages", raw_in.get("input"))
    if isinstance(raw_in, str):
        raw_in = [{"role": "user", "content": raw_in}]
    out.inputs = to_messages(raw_in)
    if isinstance(raw_out, str):
        raw_out = {"role": "assistant", "content": raw_out}
    if isinstance(raw_out, dict) and "choices" in raw_out:  # a whole completion object
        raw_out = (raw_out.get("choices") or [None])[0]
    out.outputs = to_messages(raw_out)
    usage = json_value(a.get("langfuse.observation.usage_details"))
    if isinstance(usage, dict):
        out.prompt_tokens = _tokens(usage.get("input") or usage.get("prompt_tokens") or usage.get("input_tokens"))
        out.completion_tokens = _tokens(
            usage.get("output") or usage.get("completion_tokens") or usage.get("output_tokens")
        )
    out.model = _str_or_none(a.get("langfuse.observation.model.name"))
    return out


# --- OpenLLMetry (traceloop) workflow spans --------------------------------------------------------


def _traceloop(span: dict[str, Any]) -> SpanView:
    a = span["attributes"]
    out = SpanView(convention="traceloop")
    if a.get("traceloop.span.kind") != "tool":
        out.role = "container"
        return out
    args = json_value(a.get("traceloop.entity.input"))
    if isinstance(args, dict) and set(args) <= {"args", "kwargs"}:  # the decorator's call record
        args = args.get("kwargs") or (args.get("args") or [None])[0] or {}
    result = json_value(a.get("traceloop.entity.output"))
    failed = _failed(span)
    out.role = "tool"
    out.tool = ToolRun(
        None,
        str(a.get("traceloop.entity.name") or span["name"].removesuffix(".tool")),
        args,
        result,
        failed,
        span["status"]["message"] if failed else "",
    )
    return out


def tool_call_message(run: ToolRun, call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [call(call_id, run.name, _arguments(run.arguments))]}


def _arguments(value: Any) -> Any:
    value = json_value(value)
    return value if isinstance(value, dict) else ("" if value is None else as_text(value))
