"""Turns a stored conversation and its findings into plain data for the conversation page.

Nothing here produces HTML: the template escapes every string. Evidence spans (character offsets
into a message's text, as rules report them) split the text into segments, each tagged with the
findings that cover it, so the page can highlight them in place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from vigil.rules import SEVERITY_RANK
from vigil.schema import Conversation, Message
from vigil.ui.folding import Fold, Gap
from vigil.ui.visible import hidden_count


@dataclass
class Segment:
    text: str
    findings: list[int] = field(default_factory=list)
    severity: str | None = None


@dataclass
class CallView:
    id: str | None
    name: str
    arguments: str
    result_index: int | None = None


@dataclass
class MessageView:
    index: int
    role: str
    name: str | None
    is_error: bool
    timestamp: str | None
    segments: list[Segment]
    calls: list[CallView]
    tool_call_id: str | None
    answers: str | None  # the tool name whose call this message answers
    findings: list[int]  # findings pointing at the whole message
    severity: str | None  # worst severity among findings touching this message
    reasoning: str | None = None  # the model's reasoning summary (Responses, Anthropic thinking): not said to the user
    rest: str | None = None  # a long message's text after what is shown, folded on the page
    # a long message whose findings point far into it: its opening (``lead``) and what lies between that and
    # the text around the evidence (``middle``, folded); ``segments`` then hold that text only
    lead: str | None = None
    middle: str | None = None

    @property
    def rest_lines(self) -> int:
        return self.rest.count("\n") + 1 if self.rest else 0


# A system prompt this long (a τ² policy is 16 kB, recurring in every conversation of the agent) opens
# with its first lines and folds the rest: the conversation itself starts below the fold otherwise.
LONG_SYSTEM = 1500
PREVIEW_LINES = 6
PREVIEW_CHARS = 600
# Any other message this long (a tool that returned a whole database table, a model that looped) opens with
# a screenful and folds the rest: one 900 kB tool result made the page 234,000 pixels tall, and the
# messages after it were a long scroll away.
LONG_MESSAGE = 20_000
MESSAGE_PREVIEW_LINES = 40
MESSAGE_PREVIEW_CHARS = 4_000
# Around what a finding points at in such a message (a truncated 900 kB reply is flagged at its last
# characters), this much text is shown on either side; the rest folds.
EVIDENCE_CONTEXT = 1_000


def _preview(text: str, lines: int = PREVIEW_LINES, chars: int = PREVIEW_CHARS) -> tuple[str, str]:
    """A long text's opening (at most ``lines`` lines and about ``chars`` characters, cut at a line end
    where there is one, else at a space) and the rest."""
    cut = 0
    for _ in range(lines):
        nl = text.find("\n", cut)
        if nl == -1 or nl > chars:
            break
        cut = nl + 1
    if not cut:
        space = text.rfind(" ", 0, chars)
        cut = space + 1 if space > 0 else chars
    return text[:cut], text[cut:]


TOO_DEEP = "(nested too deeply to lay out here: the conversation's JSON, GET /v1/conversations/{id}, holds it)"


def _pretty(value: Any) -> str:
    """JSON laid out for reading; a string that is not JSON as it is. What orjson cannot lay out (nested
    deeper than about 255 levels; the schema admits 1,024) is shown as sent when it came as a string, and
    as compact JSON, or a note, when it came as an object: never Python's repr, which recursion ends."""
    text = value if isinstance(value, str) else None
    if text is not None:
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        pass
    if text is not None:
        return text
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    except (RecursionError, TypeError, ValueError):
        return TOO_DEEP


def _worst(severities: list[str]) -> str | None:
    return max(severities, key=lambda s: SEVERITY_RANK.get(s, 0)) if severities else None


def _segments(text: str, spans: list[tuple[int, int, int, str]]) -> list[Segment]:
    """Split ``text`` at span boundaries; spans are (start, end, finding index, severity)."""
    if not spans:
        return [Segment(text)] if text else []
    cuts = sorted({0, len(text), *(s for s, _, _, _ in spans), *(e for _, e, _, _ in spans)})
    out = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        covering = [(k, sev) for s, e, k, sev in spans if s <= a and b <= e]
        out.append(Segment(text[a:b], sorted({k for k, _ in covering}), _worst([sev for _, sev in covering])))
    return out


def _evidence_by_message(findings: list[dict[str, Any]]) -> dict[int, list[tuple[int, dict[str, Any], str]]]:
    """Each message's evidence (finding index, evidence, severity), read once rather than once a message."""
    out: dict[int, list[tuple[int, dict[str, Any], str]]] = {}
    for k, f in enumerate(findings):
        for ev in f.get("evidence") or []:
            if isinstance(ev, dict) and isinstance(i := ev.get("message_index"), int):
                out.setdefault(i, []).append((k, ev, f.get("severity", "info")))
    return out


def _spans_for(
    evidence: list[tuple[int, dict[str, Any], str]], length: int
) -> tuple[list[tuple[int, int, int, str]], list[int]]:
    spans: list[tuple[int, int, int, str]] = []
    whole: list[int] = []
    for k, ev, severity in evidence:
        start, end = ev.get("start"), ev.get("end")
        if isinstance(start, int) and isinstance(end, int) and 0 <= start < end:
            spans.append((min(start, length), min(end, length), k, severity))
        elif k not in whole:
            whole.append(k)
    return [s for s in spans if s[0] < s[1]], whole


def build(
    document: dict[str, Any], findings: list[dict[str, Any]], only: Callable[[int], bool] | None = None
) -> list[MessageView]:
    """Message views of a stored conversation document, with findings' evidence placed; ``only``: the
    indexes to build (a long transcript's page shows a few hundred of its messages)."""
    raws = document.get("messages") or []
    raws = raws if isinstance(raws, list) else []
    # the calls' names and where their results are, read from the raw messages: validating every message
    # of a long transcript to show a few hundred of them was most of the page's time
    call_names: dict[str, str] = {}
    result_at: dict[str, int] = {}
    for i, raw in enumerate(raws):
        if not isinstance(raw, dict):
            continue
        for c in raw.get("tool_calls") or []:
            fn = c.get("function") if isinstance(c, dict) else None
            if isinstance(fn, dict) and isinstance(c.get("id"), str) and c["id"] and isinstance(fn.get("name"), str):
                call_names[c["id"]] = fn["name"]
        if raw.get("role") == "tool" and isinstance(tid := raw.get("tool_call_id"), str) and tid:
            result_at.setdefault(tid, i)
    messages: dict[int, Message] = {}
    for i, raw in enumerate(raws):
        if only is not None and not only(i):
            continue
        try:
            messages[i] = Message.model_validate(raw)
        except ValidationError:
            messages[i] = Message(role="system", content=f"(unreadable message: {str(raw)[:2000]})")
    evidence = _evidence_by_message(findings)
    out = []
    for i, m in messages.items():
        text = m.text
        spans, whole = _spans_for(evidence.get(i, []), len(text))
        if m.role == "tool" and not spans:
            text = _pretty(text) if text[:1] in ("{", "[") else text
        touching = sorted({k for *_, k, _ in spans} | set(whole))
        rest = lead = middle = None
        if m.role == "system" and not spans and len(text) > LONG_SYSTEM:
            text, rest = _preview(text)
        elif not spans and len(text) > LONG_MESSAGE:
            text, rest = _preview(text, MESSAGE_PREVIEW_LINES, MESSAGE_PREVIEW_CHARS)
        elif m.role != "system" and spans and len(text) > LONG_MESSAGE:
            text, spans, lead, middle, rest = _around_evidence(text, spans)
        out.append(
            MessageView(
                index=i,
                role=m.role,
                name=m.name,
                is_error=m.is_error,
                timestamp=m.timestamp.isoformat() if m.timestamp else None,
                segments=_segments(text, spans),
                calls=[
                    CallView(
                        c.id,
                        c.function.name,
                        _pretty(c.function.arguments),
                        result_at.get(c.id) if c.id else None,
                    )
                    for c in m.tool_calls or []
                ],
                tool_call_id=m.tool_call_id,
                answers=call_names.get(m.tool_call_id or ""),
                findings=whole,
                severity=_worst([findings[k].get("severity", "info") for k in touching]),
                reasoning=r if isinstance(r := (m.model_extra or {}).get("reasoning"), str) and r else None,
                rest=rest,
                lead=lead,
                middle=middle,
            )
        )
    return out


Spans = list[tuple[int, int, int, str]]


def _around_evidence(text: str, spans: Spans) -> tuple[str, Spans, str | None, str | None, str | None]:
    """A long message's text around its evidence (``EVIDENCE_CONTEXT`` characters either side, the spans
    shifted into it), its opening and the folded text between them (both None when the text around the
    evidence starts within the opening), and the folded rest after it (None when it reaches the end). The
    message as it is, unfolded, when folding would hide little of it."""
    a = max(0, min(s for s, _, _, _ in spans) - EVIDENCE_CONTEXT)
    b = min(len(text), max(e for _, e, _, _ in spans) + EVIDENCE_CONTEXT)
    if len(text) - (b - a) < LONG_MESSAGE // 2:
        return text, spans, None, None, None
    head = len(_preview(text, MESSAGE_PREVIEW_LINES, MESSAGE_PREVIEW_CHARS)[0])
    lead = middle = None
    if head < a:
        lead, middle = text[:head], text[head:a]
    else:
        a = 0
    shifted = [(s - a, e - a, k, sev) for s, e, k, sev in spans]
    return text[a:b], shifted, lead, middle, text[b:] or None


def folded(document: dict[str, Any], findings: list[dict[str, Any]], fold: Fold) -> list[tuple[str, Any]]:
    """The transcript's rows as ``fold`` shows them, in order: ("m", MessageView) for a shown message,
    ("gap", folding.Gap) for a folded run; only the shown messages are built."""
    views = {m.index: m for m in build(document, findings, fold.visible)}
    out: list[tuple[str, Any]] = []
    for kind, x in fold.rows():
        if isinstance(x, Gap):
            out.append((kind, x))
        elif x in views:  # a message the document does not have (a stale count) is left out
            out.append((kind, views[x]))
    return out


@dataclass
class ToolView:
    name: str
    description: str | None
    parameters: str | None  # the JSON schema, pretty-printed
    calls: int  # how often the agent called it
    offered: bool  # False: called without being offered


MAX_TOOLS_SHOWN = 100  # tools offered listed on the page (a conversation may declare thousands)
MAX_UNOFFERED_SHOWN = 50  # tools called without being offered listed, the most called first


@dataclass
class ToolCard:
    items: list[ToolView]
    offered: int  # tools offered in all
    more_offered: int  # offered ones not listed
    more_unoffered: int  # called-but-not-offered ones not listed


def tools(document: dict[str, Any]) -> ToolCard | None:
    """The tools the agent was offered (with how often it called each), then any tool it called without being
    offered, each list bounded (the rest counted); None when the conversation does not carry its tool
    definitions."""
    # the conversation's other fields, with one stand-in message: its tools do not depend on the messages
    try:
        conv = Conversation.model_validate({**document, "messages": [{"role": "user", "content": ""}]})
    except ValidationError:
        return None
    offered = conv.offered_tools
    if offered is None:
        return None
    counts: dict[str, int] = {}
    raws = document.get("messages")
    for raw in raws if isinstance(raws, list) else []:
        if isinstance(raw, dict) and raw.get("role") == "assistant" and isinstance(raw.get("tool_calls"), list):
            for c in raw["tool_calls"]:
                fn = c.get("function") if isinstance(c, dict) else None
                if isinstance(fn, dict) and isinstance(name := fn.get("name"), str):
                    counts[name] = counts.get(name, 0) + 1
    names = {t.name for t in offered}
    out = [
        ToolView(t.name, t.description, _pretty(t.parameters) if t.parameters else None, counts.get(t.name, 0), True)
        for t in offered[:MAX_TOOLS_SHOWN]
    ]
    unoffered = sorted(((n, k) for n, k in counts.items() if n not in names), key=lambda nk: -nk[1])
    out += [ToolView(n, None, None, k, False) for n, k in unoffered[:MAX_UNOFFERED_SHOWN]]
    return ToolCard(
        out,
        len(offered),
        max(0, len(offered) - MAX_TOOLS_SHOWN),
        max(0, len(unoffered) - MAX_UNOFFERED_SHOWN),
    )


def hidden_characters(m: MessageView) -> int:
    """Characters of the message a reader cannot see (see :mod:`vigil.ui.visible`), which the page marks."""
    calls = [t for c in m.calls for t in (c.name, c.arguments)]
    return hidden_count(*(seg.text for seg in m.segments), m.lead, m.middle, m.rest, m.reasoning, m.name, *calls)
