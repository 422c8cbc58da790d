"""The conversation schema Vigil ingests (version 1): OpenAI chat messages plus agent metadata.

Served as JSON Schema at ``GET /v1/schema/conversation``. A conversation may be sent again as it
grows; the copy with the highest effective revision supersedes earlier ones.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from functools import cached_property
from typing import Annotated, Any, Final, Literal, Protocol

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import TzInfo

from vigil.errors import ConfigError

SCHEMA_VERSION: Final = 1

Severity = Literal["info", "low", "medium", "high", "critical"]
SEVERITY_RANK: dict[str, int] = {"info": 0, "low": 1, "medium": 2, "high": 3, "critical": 4}

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


INCOMING: Final[dict[str, bool]] = {"incoming": True}
"""The validation context of what arrives (every way in passes it): the rules only new input must keep.
Documents stored before a rule existed are read back (judge, export, calibration, the console) without
it, so tightening the schema never makes stored conversations unreadable."""


def _incoming(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("incoming"))


def addressable_id(value: str, info: ValidationInfo) -> str:
    """An id (of a conversation, an agent, a version) that can be named in a URL, a log line, a metric label
    and a terminal: not blank, and no control characters (a newline in a conversation id made every
    per-conversation route answer 404), and not ``.`` or ``..`` (a link to ``/ui/review/..`` opens the home
    page). Checked on what arrives (:data:`INCOMING`)."""
    if not _incoming(info):
        return value
    if not value.strip():
        raise ValueError("must not be empty or only whitespace")
    if value in (".", ".."):
        raise ValueError("must not be '.' or '..': browsers and proxies read those as steps of a URL's path")
    bad = _CONTROL.search(value)
    if bad is not None:
        raise ValueError(
            f"must not contain control characters (found {bad.group()!r} at position {bad.start()}): "
            "ids are part of URLs and log lines"
        )
    return value


ConversationId = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(addressable_id)]
"""A conversation id (also in outcomes): 1-256 characters, not blank, no control characters."""
AgentId = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(addressable_id)]
"""An agent id: 1-256 characters, not blank, no control characters (a label of every metric and filter)."""
AgentVersion = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(addressable_id)]
"""An agent version: 1-128 characters, not blank, no control characters."""


def in_utc(value: datetime) -> datetime:
    """``value`` in UTC (naive meaning UTC). One whose offset moves it past year 1 or 9999
    (``0001-01-01T00:00:00+14:00``) is refused: converting it later raised OverflowError."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("in UTC this time falls outside the years 1 to 9999") from None


def _utc_representable(value: datetime, info: ValidationInfo) -> datetime:
    # an offset moves a time by less than a day: only years 1 and 9999 can overflow (checked on what arrives)
    if 1 < value.year < 9999 or not _incoming(info):
        return value
    in_utc(value)
    return value  # kept as sent: the document keeps its offset


UtcTime = Annotated[datetime, AfterValidator(_utc_representable)]
"""A time in a conversation: ISO 8601 whose UTC equivalent lies within the years 1 to 9999."""

# How far ahead of the database's clock (this host's without a database) a time that arrives (a conversation's,
# an outcome's) may be dated: clients' clocks drift by seconds, while a time hours or days ahead is a wrong time
# (the console showed outcomes that had not happened yet; a conversation dated ahead lands in an hour bucket
# after now and drags the detector's cursor). The database's clock, not this host's: what is stored is stamped
# on it (received_at, the detector's hours), and a replica whose clock runs behind would refuse fresh data.
FUTURE_ALLOWANCE: Final = timedelta(minutes=5)


HOST_CLOCK: Final = "this server's clock"
DATABASE_CLOCK: Final = "the database's clock"


@dataclass(frozen=True, slots=True)
class LatestAllowed:
    """The latest time an arriving item may carry (``at``), and the clock it was read on (``clock``: what an
    error names, :data:`HOST_CLOCK` or :data:`DATABASE_CLOCK`). Read once a batch: a batch is parsed in
    milliseconds."""

    at: datetime
    clock: str = HOST_CLOCK


class FutureBound(Protocol):
    """What a stage asks for the latest time an arriving item may carry: this host's clock (:data:`HOST_BOUND`)
    or the database's (``vigil.store.clock.DatabaseClock``), plus :data:`FUTURE_ALLOWANCE`; and for now on that
    clock. Cheap: no query."""

    def latest_allowed(self) -> LatestAllowed: ...

    def now(self) -> datetime: ...


def host_now() -> datetime:
    """This host's clock, in UTC."""
    return datetime.now(UTC)


def latest_allowed() -> LatestAllowed:
    """The latest time an arriving item may carry on this host's clock: for code without a database (``vigil
    import --dry-run``); the stages ask the runtime's :class:`FutureBound`, the database's clock."""
    return LatestAllowed(host_now() + FUTURE_ALLOWANCE)


class _HostBound:
    def latest_allowed(self) -> LatestAllowed:
        return latest_allowed()

    def now(self) -> datetime:
        return host_now()


HOST_BOUND: Final[FutureBound] = _HostBound()


def naive_hint(sent: Any) -> str:
    """What to say of a time sent without an offset: it is read as UTC, so a producer's local time east of UTC
    is hours ahead (the usual cause of an ``occurred_in_future``)."""
    if not isinstance(sent, str):
        return ""
    try:
        naive = datetime.fromisoformat(sent.replace("z", "Z")).tzinfo is None
    except ValueError:
        return ""
    return f" ({sent!r} has no UTC offset, so it is read as UTC: send the offset, e.g. +02:00)" if naive else ""


def in_future(field: str, value: datetime, latest: LatestAllowed, advice: str, sent: Any = None) -> dict[str, str]:
    """The field error of a time later than ``latest`` (:class:`FutureBound`): the field, the time, the clock
    read and the allowance, what to do, and the hint of :func:`naive_hint` for ``sent``."""
    minutes = int(FUTURE_ALLOWANCE.total_seconds() // 60)
    now = latest.at - FUTURE_ALLOWANCE
    message = (
        f"{field} {in_utc(value).isoformat()} is in the future: {latest.clock} reads "
        f"{now.isoformat(timespec='seconds')} and takes times at most {minutes} minutes ahead of it "
        f"(up to {latest.at.isoformat(timespec='seconds')}); {advice}" + naive_hint(sent)
    )
    return {"field": field, "message": message}


# Every model writes NaN/Infinity as such (not as null), so the decoder refuses them by name.
MAX_INT = 2**63 - 1  # what a database BIGINT holds

# orjson reads an integer outside [-2**63, 2**64) as the nearest double. Every such integer is written
# with at least 19 digits in a row, and a run that long is found fastest by one C pass that maps each
# digit to "0" and every other byte to "." (a regular expression looking for it costs 10x more).
_DIGIT_RUNS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x2E for b in range(256))
_LONG_RUN = b"0" * 19


_WIDE = float(2**63)


def _has_wide_double(value: Any) -> bool:
    """Whether a parsed value holds a double of magnitude 2**63 or more: where orjson put an integer it
    could not hold (or a number written so, ``1e19``). Without one, no integer of the text was rounded."""
    stack = [value]
    pop, push = stack.pop, stack.extend
    while stack:
        v = pop()
        if type(v) is dict:
            push(v.values())
        elif type(v) is list:
            push(v)
        elif type(v) is float and not -_WIDE < v < _WIDE:
            return True
    return False


def loads_exact(raw: bytes | str) -> Any:
    """Strict JSON (orjson's grammar and errors) in which every integer keeps its exact value.

    A text that may hold an integer beyond 64 bits is read a second time by Python's own parser, which
    keeps integers exact and otherwise yields the same values for what the strict parse accepted.
    """
    value = orjson.loads(raw)
    data = raw.encode() if isinstance(raw, str) else raw
    # a long run inside a string (an id) rounds nothing: only a double of 2**63 or more says one was
    if _LONG_RUN not in data.translate(_DIGIT_RUNS) or not _has_wide_double(value):
        return value
    try:
        return json.loads(raw)
    except RecursionError:  # nested deeper than Python's parser goes (orjson allows 1024 levels)
        return value


class _NonFinite:
    """What the lenient parser puts where strict JSON has no value (NaN, Infinity, 1e999)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _lenient_float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if value - value == 0 else _NonFinite(text)


_MAX_JSON_INT = 2**1024  # beyond a double's range: strict JSON readers see infinity
_MAX_INT_DIGITS = len(str(_MAX_JSON_INT))  # more digits than this are always beyond it


def _lenient_int(text: str) -> int | _NonFinite:
    """An integer, or (more digits than any integer a double holds) the marker of a non-finite number.

    Python refuses to make an int of more than 4,300 digits (``sys.get_int_max_str_digits``), which would
    fail the whole body; such a number is beyond a double's range anyway, so only its item is refused."""
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        return _NonFinite(text)
    return int(text)


def lenient_loads(raw: bytes | str) -> Any:
    """Python's own JSON parser, which also reads what strict JSON refuses (NaN, lone surrogates).

    Used only after the strict parse failed, to tell which item of a batch (and which field) is at fault.
    """
    return json.loads(raw, parse_constant=_NonFinite, parse_float=_lenient_float, parse_int=_lenient_int)


def _field(key: Any) -> str:
    """A key as a field path names it: a lone surrogate escaped (``\\udc00``), so the path can be stored."""
    text = str(key)
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def unstorable(obj: Any, path: str = "") -> tuple[str, str] | None:
    """(reason, field) of the first value strict JSON cannot hold (a reason of :data:`UNSTORABLE`), or None."""
    if isinstance(obj, _NonFinite):
        return "non_finite_number", path or "(root)"
    if isinstance(obj, str):
        try:
            obj.encode()
        except UnicodeEncodeError:
            return "invalid_unicode", path or "(root)"
        return None
    if isinstance(obj, float):
        return None if obj - obj == 0 else ("non_finite_number", path or "(root)")
    if isinstance(obj, int) and not -_MAX_JSON_INT < obj < _MAX_JSON_INT:
        return "non_finite_number", path or "(root)"
    if isinstance(obj, dict):
        for k, v in obj.items():
            sub = f"{path}.{_field(k)}" if path else _field(k)
            found = unstorable(k, sub) or unstorable(v, sub)
            if found:
                return found
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found = unstorable(v, f"{path}.{i}" if path else str(i))
            if found:
                return found
    return None


UNSTORABLE = {
    "non_finite_number": "NaN, Infinity and numbers beyond a double's range are not JSON values Vigil stores",
    "invalid_unicode": "a lone UTF-16 surrogate (e.g. \\ud800) is not a character",
}


def item_raw(item: Any) -> bytes:
    """One item of a leniently parsed body as bytes to keep (a dead letter's body)."""
    try:
        return orjson.dumps(item)
    except TypeError:  # a lone surrogate or non-finite marker: keep Python's escaped rendering
        return json.dumps(item, default=lambda v: v.text if isinstance(v, _NonFinite) else str(v)).encode()


class UnreadableJson(ValueError):
    """A body that is not JSON even to the lenient parser; the message is the strict parser's."""


def read_items(body: bytes) -> tuple[list[Any], dict[int, tuple[str, str]]]:
    """A body's items (one object or an array of them) and, by index, ``(reason, field)`` of each item strict
    JSON cannot hold (:func:`unstorable`): a ``NaN``, ``Infinity`` or lone surrogate refuses only its item,
    never the batch. Raises :class:`UnreadableJson` for a body that is not JSON."""
    try:
        payload = orjson.loads(body)
        refused: dict[int, tuple[str, str]] = {}
    except orjson.JSONDecodeError as exc:
        try:
            payload = lenient_loads(body)
        except (ValueError, RecursionError):
            raise UnreadableJson(f"body is not JSON: {exc}") from None
        items = payload if isinstance(payload, list) else [payload]
        refused = {i: found for i, obj in enumerate(items) if (found := unstorable(obj)) is not None}
        if not refused:  # what the strict parser refused is not one of these values: keep its answer
            raise UnreadableJson(f"body is not JSON: {exc}") from None
    return (payload if isinstance(payload, list) else [payload]), refused


def dumps_exact(value: Any, sort_keys: bool = False) -> str:
    """JSON text of ``value`` (orjson), also when it holds an integer beyond 64 bits, which orjson refuses
    and Python's encoder writes exactly; ``sort_keys`` sorts every object's keys."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None).decode()
    except TypeError as exc:
        if "64-bit" not in str(exc):
            raise
        return json.dumps(value, ensure_ascii=False, sort_keys=sort_keys)


# What decoding JSON costs in memory beyond its strings (orjson, CPython 3.11, measured): an object or
# array about 84 bytes even when empty, every further item at least its 8-byte pointer and a small
# object. 16 MB of nothing but "{}," decodes to 448 MB, of "0," to 183 MB; real conversation batches
# estimate at about their own size (0.8 to 1.1 times, the tau2 conversations).
JSON_CONTAINER_BYTES = 96
JSON_ITEM_BYTES = 24
EXPANSION_CHECKED_FROM = 65_536  # bytes: a smaller body decodes to a few MB at worst


def decoded_estimate(raw: bytes | memoryview) -> int:
    """At most the bytes that decoding ``raw`` as JSON would take beyond its strings, from its count of
    ``{``, ``[`` and ``,`` (those inside strings counted too: an overestimate). One vectorised pass per
    byte value, about a tenth of what parsing the body costs; :func:`too_dense` scans a body this puts
    over its bound again, leaving its strings out."""
    import numpy as np

    a = np.frombuffer(raw, dtype=np.uint8)
    containers = int(np.count_nonzero(a == 0x7B)) + int(np.count_nonzero(a == 0x5B))
    return JSON_CONTAINER_BYTES * containers + JSON_ITEM_BYTES * int(np.count_nonzero(a == 0x2C))


STRING_SCAN_CHUNK = 262_144  # bytes a step of the string-aware count reads: its arrays take ~25 times this


def _outside_strings(raw: bytes | memoryview) -> int:
    """:func:`decoded_estimate` of ``raw`` counting only the brackets and commas outside its strings: a
    quote opens or closes a string unless an odd run of backslashes precedes it. Linear, vectorised, a
    chunk at a time (the state carried across chunks: inside a string or not, and the parity of the run
    of backslashes the chunk ended with)."""
    import numpy as np

    a = np.frombuffer(raw, dtype=np.uint8)
    containers = items = 0
    inside, odd_run = 0, 0
    for at in range(0, len(a), STRING_SCAN_CHUNK):
        c = a[at : at + STRING_SCAN_CHUNK]
        idx = np.arange(len(c), dtype=np.int32)
        backslash = c == 0x5C
        # the last byte at or before each position that is not a backslash (-1: none in this chunk)
        last_other = np.maximum.accumulate(np.where(backslash, -1, idx))
        run_before = np.empty(len(c), dtype=np.int32)  # backslashes just before each byte
        run_before[0] = odd_run
        run_before[1:] = idx[:-1] - last_other[:-1]
        run_before[1:][last_other[:-1] < 0] += odd_run
        quote = (c == 0x22) & (run_before % 2 == 0)
        within = (np.cumsum(quote, dtype=np.int32) + inside) % 2 == 1  # a closing quote reads as outside
        outside = ~within
        containers += int(np.count_nonzero(outside & ((c == 0x7B) | (c == 0x5B))))
        items += int(np.count_nonzero(outside & (c == 0x2C)))
        inside = int(within[-1])
        trailing = len(c) - 1 - int(last_other[-1])
        odd_run = (trailing + (odd_run if last_other[-1] < 0 else 0)) % 2
    return JSON_CONTAINER_BYTES * containers + JSON_ITEM_BYTES * items


def too_dense(
    raw: bytes | memoryview,
    expansion: float,
    setting: str = "VIGIL_MAX_JSON_EXPANSION",
    what: str = "body",
    advice: str = "send fewer values per request",
) -> str | None:
    """Why a JSON body (or a Kafka message: ``what``) is refused before it is decoded (it would take more
    than ``expansion`` times its own size in memory: a flood of empty objects), or None. Bodies under
    64 KiB are not checked. Brackets and commas inside strings do not count: a tool result of CSV text or
    of a JSON document sent as a string (``"0,1,0,..."``) is the one string it decodes to."""
    if expansion <= 0 or len(raw) < EXPANSION_CHECKED_FROM:
        return None
    bound = expansion * len(raw)
    if decoded_estimate(raw) <= bound:
        return None
    estimate = _outside_strings(raw)  # over the bound by its every bracket and comma: those of strings left out
    if estimate <= bound:
        return None
    return (
        f"{what} of {len(raw)} bytes holds so many JSON objects, arrays and items that decoding it would take "
        f"about {estimate // 1_048_576} MiB, {estimate / len(raw):.0f} times its size (more than {setting}="
        f"{expansion:g}): {advice}"
    )


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")

    name: str = Field(min_length=1, max_length=256)
    arguments: str | dict[str, Any] = Field(
        default="{}", description="JSON-encoded string (as OpenAI sends it) or an object."
    )


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall

    @property
    def name(self) -> str:
        return self.function.name

    @cached_property
    def args(self) -> dict[str, Any]:
        raw = self.function.arguments
        if isinstance(raw, dict):
            return raw
        try:
            value = loads_exact(raw) if raw else {}
        except orjson.JSONDecodeError:
            return {"_raw": raw}
        return value if isinstance(value, dict) else {"_value": value}


# Content blocks of other formats that Vigil's schema would misread as parts without text (a tool call
# read as an empty reply): refused, naming the format to send them in.
FOREIGN_PARTS: Final = frozenset({"tool_use", "tool_result", "server_tool_use", "thinking", "redacted_thinking"})
# Anthropic's MCP connector calls and server tools' results (web_search_tool_result...): refused in what
# arrives (stored documents holding one, from before, are read back as stored).
FOREIGN_INCOMING: Final = frozenset({"mcp_tool_use"})


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")

    type: str
    text: str | None = None

    @property
    def refusal(self) -> str | None:
        """A refusal part's text (OpenAI chat: ``{"type": "refusal", "refusal": "..."}``): what the model
        said, which rules read as they read text."""
        value = (self.model_extra or {}).get("refusal") if self.type == "refusal" else None
        return value if isinstance(value, str) else None

    @field_validator("type")
    @classmethod
    def _not_foreign(cls, value: str, info: ValidationInfo) -> str:
        incoming = _incoming(info) and (value in FOREIGN_INCOMING or value.endswith("_tool_result"))
        if value in FOREIGN_PARTS or incoming:
            raise ValueError(
                f"a {value} block is Anthropic Messages, not Vigil's schema (tool calls go in tool_calls): "
                "send it with ?format=anthropic (or vigil import)"
            )
        return value


class Message(BaseModel):
    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(default=None, description="On tool results: the call answered.")
    name: str | None = None
    is_error: bool = Field(default=False, description="On tool results: the tool call failed.")
    timestamp: UtcTime | None = None

    @property
    def text(self) -> str:
        c = self.content
        if c is None:
            return ""
        if isinstance(c, str):
            return c
        return "\n".join(t for p in c if (t := p.text or p.refusal))


class ToolDef(BaseModel):
    """A tool the agent was offered: its name, description and parameters (a JSON schema).

    Also read as sent by the APIs: OpenAI chat's ``{"type": "function", "function": {...}}``, the Responses
    API's flat ``{"type": "function", "name", "parameters"}`` and Anthropic's ``input_schema``. A hosted
    tool without a name (``{"type": "web_search"}``) is named after its type.
    """

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")

    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="JSON schema of the arguments.")

    @model_validator(mode="before")
    @classmethod
    def _api_shapes(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        if isinstance(value.get("function"), dict):  # OpenAI chat completions
            return {**value["function"]}
        if "input_schema" in value and "parameters" not in value:  # Anthropic
            out = {k: v for k, v in value.items() if k != "input_schema"}
            out["parameters"] = value["input_schema"]
            return out
        if value.get("type") == "function":  # Responses API: flat
            return {k: v for k, v in value.items() if k != "type"}
        if "name" not in value and isinstance(value.get("type"), str):  # a hosted tool
            return {**value, "name": value["type"]}
        return value

    def as_openai(self) -> dict[str, Any]:
        """As an OpenAI chat function definition (what Inspect, verifiers and litellm read)."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description:
            fn["description"] = self.description
        fn["parameters"] = self.parameters if self.parameters is not None else {"type": "object", "properties": {}}
        return {"type": "function", "function": fn}


class Usage(BaseModel):
    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")

    prompt_tokens: int | None = Field(default=None, ge=0, le=MAX_INT)
    completion_tokens: int | None = Field(default=None, ge=0, le=MAX_INT)
    total_tokens: int | None = Field(default=None, ge=0, le=MAX_INT)
    cost_usd: float | None = Field(default=None, ge=0)
    latency_ms: float | None = Field(default=None, ge=0)

    @property
    def tokens(self) -> int | None:
        if self.total_tokens is not None:
            return self.total_tokens
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)


class InlineOutcome(BaseModel):
    """An outcome signal carried with the conversation (e.g. a benchmark's reward)."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    type: str = Field(min_length=1, max_length=64)
    value: float = 1.0
    occurred_at: UtcTime | None = None
    idempotency_key: str | None = Field(default=None, min_length=1)

    @field_validator("idempotency_key")
    @classmethod
    def _printable_key(cls, v: str | None, info: ValidationInfo) -> str | None:
        """A key as ``POST /v1/outcomes`` takes it: no control characters (Postgres cannot store NUL; a
        key longer than 512 characters, which its column cannot hold, made the whole conversation a
        ``store_rejected`` dead letter). Checked on what arrives."""
        if v is None or not _incoming(info):
            return v
        if len(v) > 512:
            raise ValueError(f"must be at most 512 characters, not {len(v)}")
        if (bad := _CONTROL.search(v)) is not None:
            raise ValueError(f"must not contain control characters (found {bad.group()!r} at position {bad.start()})")
        return v


class Conversation(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    schema_version: Literal[1] = SCHEMA_VERSION
    conversation_id: ConversationId
    revision: int | None = Field(
        default=None,
        ge=0,
        le=MAX_INT,
        description="Increases as the conversation grows; newest supersedes.",
    )
    updated_at: UtcTime | None = Field(default=None, description="Used as the revision when `revision` is absent.")
    started_at: UtcTime | None = None
    ended_at: UtcTime | None = None
    status: Literal["in_progress", "finished"] | None = None
    agent_id: AgentId
    agent_version: AgentVersion
    task_id: str | None = Field(default=None, max_length=256)
    intent: str | None = Field(default=None, max_length=256)
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] | None = Field(
        default=None, description="The tools the agent was offered (name, description, parameters JSON schema)."
    )
    usage: Usage | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    outcomes: list[InlineOutcome] = Field(default_factory=list)

    @field_validator("revision", mode="before")
    @classmethod
    def _integer_revision(cls, v: Any, info: ValidationInfo) -> Any:
        """What arrives gives its revision as a JSON integer: "3" and true were stored as sent, and read as 3
        and 1 (documents stored so are still read that way)."""
        if v is not None and _incoming(info) and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError("must be an integer (a JSON number without a fraction), not a string or a boolean")
        return v

    @property
    def offered_tools(self) -> list[ToolDef] | None:
        """The tools the agent was offered: ``tools``, else definitions kept in ``metadata.tools`` (OTLP spans
        put them there); None when the conversation does not say."""
        if self.tools is not None:
            return self.tools
        declared = self.metadata.get("tools")
        if not isinstance(declared, list) or not declared:
            return None
        out = []
        for t in declared:
            try:
                out.append(ToolDef.model_validate(t))
            except ValueError:
                continue
        return out or None

    @property
    def effective_revision(self) -> int:
        if self.revision is not None:
            return self.revision
        if self.updated_at is not None:
            return int(self.updated_at.timestamp() * 1_000_000)
        return len(self.messages)


_CONVERSATION_ADVICE = "send it once that time has come, or fix the clock or time zone of the host that stamped it"
_INLINE_OUTCOME_ADVICE = "send the outcome once it has happened, or leave occurred_at out for the conversation's end"


def _sent(document: Any, path: tuple[str | int, ...]) -> Any:
    """The value ``document`` (a conversation as parsed from JSON) holds at ``path``, or None."""
    for step in path:
        if isinstance(step, int):
            document = document[step] if isinstance(document, list) and step < len(document) else None
        else:
            document = document.get(step) if isinstance(document, dict) else None
    return document


def conversation_in_future(
    conversation: Conversation, latest: LatestAllowed, document: Any = None, limit: int = 20
) -> tuple[list[dict[str, str]], int]:
    """The field errors of the first ``limit`` times of ``conversation`` later than ``latest``
    (:class:`FutureBound`), and how many there are: ``started_at``, ``ended_at``, ``updated_at``, each
    message's ``timestamp`` and each inline outcome's ``occurred_at``; none when no time is. ``document`` (what
    was parsed, when there is one) names a time sent without an offset. Only the errors returned are built:
    a message each, where a hostile conversation dates thousands of messages ahead."""
    c = conversation
    # latest on each offset's wall clock (naive: UTC's): a time compares with it as with its own tzinfo object,
    # field by field, where against UTC each comparison asks both offsets (0.45 us against 0.05: most of the
    # check's cost). Only for fixed offsets (what the schema parses); a zone's wall clock repeats an hour.
    at = latest.at
    refs: dict[tzinfo | None, datetime] = {None: at.astimezone(UTC).replace(tzinfo=None)}
    known = refs.get

    def ref(tz: tzinfo | None) -> datetime:
        refs[tz] = at.astimezone(tz) if isinstance(tz, (TzInfo, timezone)) else at
        return refs[tz]

    times: list[tuple[tuple[str | int, ...], datetime]] = [
        (path, t)
        for path, t in ((("started_at",), c.started_at), (("ended_at",), c.ended_at), (("updated_at",), c.updated_at))
        if t is not None and t > (known(t.tzinfo) or ref(t.tzinfo))
    ]
    times += [
        (("messages", i, "timestamp"), t)
        for i, m in enumerate(c.messages)
        if (t := m.timestamp) is not None and t > (known(t.tzinfo) or ref(t.tzinfo))
    ]
    times += [
        (("outcomes", i, "occurred_at"), t)
        for i, o in enumerate(c.outcomes)
        if (t := o.occurred_at) is not None and t > (known(t.tzinfo) or ref(t.tzinfo))
    ]
    errors = [
        in_future(
            ".".join(map(str, path)),
            value,
            latest,
            _INLINE_OUTCOME_ADVICE if path[0] == "outcomes" else _CONVERSATION_ADVICE,
            _sent(document, path),
        )
        for path, value in times[:limit]
    ]
    return errors, len(times)


def conversation_json_schema() -> dict[str, Any]:
    schema = Conversation.model_json_schema()
    schema["$id"] = f"https://vigil.dev/schema/conversation/v{SCHEMA_VERSION}.json"
    schema["title"] = f"Vigil conversation, schema version {SCHEMA_VERSION}"
    return schema


# Outcome types: the built-in ones and custom ones declared in ``VIGIL_OUTCOME_TYPES``.
#
# A type's kind says how it reads: ``bad`` events (escalation) are worse when more frequent, ``good``
# events (thumbs_up, task_success) are better when more frequent, and ``score`` types (csat) carry a
# value whose mean is reported.

Kind = Literal["bad", "good", "score"]
KINDS: tuple[Kind, ...] = ("bad", "good", "score")

BUILTIN_OUTCOMES: dict[str, Kind] = {
    "refund_reversal": "bad",
    "escalation": "bad",
    "reopened_ticket": "bad",
    "thumbs_down": "bad",
    "thumbs_up": "good",
    "csat": "score",
    "task_success": "good",
}

# τ-bench counts a trial as solved only at full reward; partial rewards are failures.
SUCCESS_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class OutcomeType:
    name: str
    kind: Kind

    def happened(self, value: float) -> bool:
        """Whether an outcome of this type with ``value`` counts as the event occurring."""
        if self.name == "task_success":
            return value >= 1.0 - SUCCESS_TOLERANCE
        return value > 0


def outcome_types(spec: str) -> dict[str, OutcomeType]:
    """Built-in types plus ``name:kind,...`` from settings; raises ConfigError on a bad entry."""
    types = {name: OutcomeType(name, kind) for name, kind in BUILTIN_OUTCOMES.items()}
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        name, _, kind = entry.partition(":")
        name, kind = name.strip(), (kind.strip() or "bad")
        if not name or len(name) > 64 or not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"VIGIL_OUTCOME_TYPES: {name!r} must be 1-64 letters, digits, _ or -")
        if kind not in KINDS:
            raise ConfigError(f"VIGIL_OUTCOME_TYPES: kind of {name!r} must be bad, good or score, not {kind!r}")
        types[name] = OutcomeType(name, kind)  # type: ignore[arg-type]
    return types
