"""PII redaction applied to every exported task before it leaves Vigil.

Built in: every kind the detector behind the ``pii_leak`` rule knows (:mod:`vigil.rules.pii`: emails
however written, phones, Luhn-valid cards, SSNs, IBANs, IP addresses, dates of birth, street addresses,
keys, tokens and passwords); the personal names the conversation states as data (:mod:`vigil.export.names`:
a profile's ``first_name`` and ``last_name``, a customer's ``full_name``), wherever they occur in its task,
unless ``VIGIL_EXPORT_REDACT_NAMES`` is off; plus the operator's own patterns from
``VIGIL_EXPORT_REDACT_PATTERNS``, run on RE2 like every pattern that sees traffic. A match becomes
``[REDACTED:<kind>]``.

A string that holds a JSON object or array (tool-call arguments, tool results) is redacted value by
value and written back as JSON: redacting its text would turn a phone number written as a JSON number
into invalid JSON, and miss an address hidden behind a ``\u0040`` escape. Numbers are redacted too
(``{"phone": 4155550123}``): a number the detectors flag becomes the ``[REDACTED:<kind>]`` string.

A value split across consecutive assistant replies (:mod:`vigil.rules.pii_split`) is replaced in every
reply holding a part, a reply holding JSON included: there the part is replaced within the JSON's strings
and numbers, so it stays JSON.

The detectors read each text folded (:mod:`vigil.rules.fold`: invisible format characters dropped,
compatibility forms, other scripts' digits and dashes between digits written as ASCII), the operator's
patterns and the names too; a match replaces the original characters it came from. A reader sees
``jane@example.com`` in ``jane@exam\u200bple.com``: so must the redaction.
"""

from __future__ import annotations

import copy
import re
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import orjson

from vigil.errors import ConfigError
from vigil.export.names import NAME_KEYS, Names, key_form, stated
from vigil.rules import pii, pii_split
from vigil.rules.fold import Folded
from vigil.rules.patterns import UnsupportedPattern, compile_linear

if TYPE_CHECKING:
    from vigil.settings import Settings

BUILTIN: list[str] = list(pii.KINDS)
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class Redactor:
    """Redacts texts and JSON values. One redactor serves a whole export run (its ``counts`` are the run's);
    :meth:`with_names` gives the one for a task, which also redacts that conversation's names."""

    def __init__(
        self, patterns: dict[str, str] | None = None, redact_names: bool = True, name_keys: Iterable[str] = ()
    ) -> None:
        self.name_keys = NAME_KEYS | {key_form(k) for k in name_keys} if redact_names else None
        self.names = Names(())
        self.patterns: dict[str, Any] = {}
        for name, rx in (patterns or {}).items():
            if not NAME_RE.match(name) or name in BUILTIN:
                raise ConfigError(
                    f"VIGIL_EXPORT_REDACT_PATTERNS: name {name!r} must match {NAME_RE.pattern} "
                    f"and not be one of {BUILTIN}"
                )
            try:
                self.patterns[name] = compile_linear(rx)
            except UnsupportedPattern as exc:
                raise ConfigError(f"VIGIL_EXPORT_REDACT_PATTERNS: {name}: invalid regex: {exc}") from None
        self.counts: Counter[str] = Counter()

    @classmethod
    def of(cls, settings: Settings) -> Redactor:
        """The redactor ``VIGIL_EXPORT_REDACT_*`` configure (a bad pattern raises :class:`ConfigError`)."""
        return cls(settings.export_redact_patterns, settings.export_redact_names, settings.export_redact_name_keys)

    def stated_names(self, obj: Any) -> set[str]:
        """The personal names ``obj`` states as data (none when name redaction is off)."""
        return stated(obj, self.name_keys) if self.name_keys is not None else set()

    def with_names(self, values: Iterable[str]) -> Redactor:
        """This redactor also redacting the names ``values`` (whole and each part), counting into the same
        ``counts``."""
        out = copy.copy(self)
        out.names = Names(values)
        return out

    def text(self, text: str, context: str = "", extra: Iterable[tuple[int, int, str, bool]] = ()) -> str:
        """``text`` with every match replaced. ``context`` (``"phone: "``, the key a JSON value stands
        under) is read before the text, so detectors that need a keyword see it, and is not returned.
        ``extra``: spans of ``text`` to replace besides, found outside it (the part of a value split across
        messages), each ``(start, end, kind, counted)``: a value's other parts are not counted again."""
        folded = Folded(context + text if context else text)
        full = folded.text
        skip = len(context)
        found: list[tuple[int, int, str]] = []
        for name, rx in self.patterns.items():
            found.extend((m.start(), m.end(), name) for m in rx.finditer(full) if m.end() > m.start())
        found.extend((start, end, "name") for start, end in self.names.find(full))
        spans: list[tuple[int, int, str, bool]] = [(f.start, f.end, f.kind, True) for f in pii.detect_folded(folded)]
        spans.extend((folded.start(a), folded.end(b), kind, True) for a, b, kind in found)
        spans.extend((a + skip, b + skip, kind, counted) for a, b, kind, counted in extra)
        spans = [s for s in spans if s[1] > skip]
        if not spans:
            return text
        spans.sort(key=lambda s: (s[0], -(s[1] - s[0])))
        out, pos = [], 0
        for start, end, kind, counted in spans:
            start, end = max(start - skip, 0), end - skip
            if start < pos:  # overlaps a longer match already replaced
                continue
            out.append(text[pos:start])
            out.append(f"[REDACTED:{kind}]")
            self.counts[kind] += counted
            pos = end
        out.append(text[pos:])
        return "".join(out)

    def embedded(self, text: str, context: str = "") -> str:
        """``text`` redacted; one that holds a JSON object or array redacted value by value and written
        back as JSON (unchanged when nothing in it is redacted), so the result is still JSON."""
        parsed = _structured(text)
        if parsed is None:
            return self.text(text, context)
        from vigil.schema import dumps_exact

        try:
            redacted = self.value(parsed, context)
            return text if redacted == parsed else dumps_exact(redacted)
        except (ValueError, RecursionError):  # nested too deep to walk
            return self.text(text, context)

    def number(self, n: int | float, context: str = "") -> int | float | str:
        """A number the detectors flag as written (a phone or card number sent as a JSON number) becomes
        its redaction, a string; any other number is kept."""
        written = str(n)
        redacted = self.text(written, context)
        return n if redacted == written else redacted

    def value(self, obj: Any, context: str = "") -> Any:
        """Redact every string and number inside ``obj`` (dicts, lists, strings), keys included; a value is
        read under its key (``"phone: 4155550123"``), and strings that hold JSON as :meth:`embedded` does."""
        if isinstance(obj, str):
            return self.embedded(obj, context)
        if isinstance(obj, bool) or obj is None:
            return obj
        if isinstance(obj, int | float):
            return self.number(obj, context)
        if isinstance(obj, dict):
            return self._mapping(obj)
        if isinstance(obj, list | tuple):
            return [self.value(v, context) for v in obj]
        return obj

    def _mapping(self, obj: dict[Any, Any]) -> dict[Any, Any]:
        """Each value redacted under its key, and each key as text: a result keyed by its customers' emails
        (``{"jane@example.com": {...}}``) is personal data in its keys. Two keys redacted alike stay two
        (``[REDACTED:email]``, ``[REDACTED:email] 2``): folding them would drop a value."""
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            key = self.text(k) if isinstance(k, str) else k
            if key != k:
                n, base = 1, key
                while key in obj or key in out:
                    n += 1
                    key = f"{base} {n}"
            out[key] = self.value(v, f"{k}: ")
        return out


def _structured(text: str) -> dict[Any, Any] | list[Any] | None:
    """The JSON object or array ``text`` holds, which :meth:`Redactor.embedded` redacts value by value; else None."""
    if text[:1] not in ("{", "[") and text.lstrip()[:1] not in ("{", "["):
        return None
    from vigil.schema import loads_exact

    try:
        parsed = loads_exact(text)
    except (orjson.JSONDecodeError, ValueError, RecursionError):  # not JSON, or nested too deep to read
        return None
    return parsed if isinstance(parsed, dict | list) else None


# Identifiers Vigil generated or keeps as keys, never content: redacting them breaks what they join (a
# Luhn-valid digit run in a hex hash reads as a card). Everything else of the task is redacted.
_TASK_IDS = ("schema", "task_id", "group_key", "source", "duplicates")
_FAILURE_IDS = ("message_index", "located_by", "category", "severity")
_RULE_IDS = ("rule_id", "rule_type", "severity")
_JUDGE_IDS = ("judge", "judge_version", "verdict")


def _except(redactor: Redactor, obj: Any, keep: tuple[str, ...]) -> Any:
    if not isinstance(obj, dict):
        return redactor.value(obj)
    return {k: v if k in keep else redactor.value(v) for k, v in obj.items()}


def _message(redactor: Redactor, m: Any, split: list[tuple[int, int, str, bool]] | None = None) -> Any:
    """A message redacted, its tool call ids and the id of the call a tool result answers kept; ``split``:
    the spans of its text that hold part of a value split across messages (or a value after its keyword in
    the message before), in its content as written, JSON or not."""
    if not isinstance(m, dict):
        return redactor.value(m)
    if split:
        out = _except(redactor, m, ("role", "tool_call_id", "content"))
        content = m["content"]
        if _structured(content) is None:
            out["content"] = redactor.text(content, extra=split)
        else:
            out["content"] = redactor.embedded(_json_parts(redactor, content, split))
    else:
        out = _except(redactor, m, ("role", "tool_call_id"))
    if isinstance(m.get("tool_calls"), list):
        out["tool_calls"] = [_except(redactor, c, ("id", "type")) for c in m["tool_calls"]]
    return out


def redact_task(redactor: Redactor, task: dict[str, Any], names: Iterable[str] = ()) -> dict[str, Any]:
    """The native task with every string of its content redacted, its identifiers kept as they are.

    The names its messages state as data, and ``names`` (those of its whole conversation: a profile read
    after the failing turn names the user who spoke before it), are redacted wherever they occur in it."""
    failure = task.get("failure")
    turn = failure.get("failed_turn") if isinstance(failure, dict) else None
    redactor = redactor.with_names({*names, *redactor.stated_names([task.get("messages"), turn])})
    # messages and failure are redacted once, below, keeping their own identifiers: redacted here too,
    # each of their values was counted twice in vigil_export_redactions_total (the failed turn three times)
    out = _except(redactor, task, (*_TASK_IDS, "messages", "failure"))
    messages = task.get("messages") or []
    split = _split_spans([*messages, turn])
    out["messages"] = [_message(redactor, m, split.get(i)) for i, m in enumerate(messages)]
    if isinstance(failure, dict):
        red = _except(redactor, failure, (*_FAILURE_IDS, "failed_turn", "rules", "judges"))
        if failure.get("failed_turn") is not None:
            red["failed_turn"] = _message(redactor, failure["failed_turn"], split.get(len(messages)))
        red["rules"] = [_except(redactor, r, _RULE_IDS) for r in failure.get("rules") or []]
        red["judges"] = [_except(redactor, j, _JUDGE_IDS) for j in failure.get("judges") or []]
        out["failure"] = red
    elif "failure" in task:
        out["failure"] = redactor.value(failure)
    return out


def _split_spans(messages: list[Any]) -> dict[int, list[tuple[int, int, str, bool]]]:
    """The parts of values split across consecutive assistant messages (:mod:`vigil.rules.pii_split`), by
    message: the span of each message's ``content`` string that holds one. The failed turn follows the
    task's messages directly (they are the conversation up to it), so a value it completes is found too.
    A value that extends one found inside a message (``jane@example.co`` then ``m``) is replaced whole.
    Content that is a JSON object or array is read as written, as ``pii_leak`` reads it (its parts are then
    replaced in its JSON by :func:`_json_parts`); content given as a list of parts is not read across."""

    def role_text(m: Any) -> tuple[str, str]:
        if not isinstance(m, dict):
            return "", ""
        content = m.get("content")
        return str(m.get("role")), content if isinstance(content, str) else ""

    pairs = [role_text(m) for m in messages]
    out: dict[int, list[tuple[int, int, str, bool]]] = {}
    for chain in pii_split.chains(pairs):
        texts = [pairs[i][1] for i in chain]
        inside = [pii.detect_folded(Folded(t)) for t in texts]
        turns = pii_split.answered(chain, [role for role, _ in pairs])
        for split in pii_split.splits(texts, pii.KINDS, inside, extending=True, after_turn=turns):
            for n, part in enumerate(split.parts):
                out.setdefault(chain[part.index], []).append((part.start, part.end, split.kind, n == 0))
    return out


# A JSON text's scalars as written: strings (quotes included, escapes whole), numbers and the literals. Run on
# a text that parsed as JSON, from its start, it meets every string whole, so a digit or a word inside one is
# never read as a number or a literal.
_JSON_SCALAR = compile_linear(r'"(?:[^"\\]|\\.)*"|-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null')


def _json_parts(redactor: Redactor, text: str, spans: list[tuple[int, int, str, bool]]) -> str:
    """``text``, a JSON object or array as written, with the parts of split values at ``spans`` replaced, each
    ``(start, end, kind, counted)``, so that it stays JSON: within a string, the part's characters (the whole
    string's when it holds an escape, which the part could cut in two); a number or a literal (``true``,
    ``false``, ``null``) the part touches, whole, by its redaction as a string (as :meth:`Redactor.number`
    does for a number); brackets, braces, colons and commas,
    which hold nothing of a value, stay. Every value's first part is counted, replaced or not."""
    scalars = [m.span() for m in _JSON_SCALAR.finditer(text)]
    starts = [a for a, _ in scalars]
    edits: list[tuple[int, int, str]] = []
    for start, end, kind, counted in sorted(spans):
        redactor.counts[kind] += counted
        for i in range(max(0, bisect_right(starts, start) - 1), bisect_left(starts, end)):
            a, b = scalars[i]
            if text[a] != '"':
                if b > start:
                    edits.append((a, b, f'"[REDACTED:{kind}]"'))
                continue
            lo, hi = max(start, a + 1), min(end, b - 1)
            if lo < hi:
                if "\\" in text[a + 1 : b - 1]:
                    lo, hi = a + 1, b - 1
                edits.append((lo, hi, f"[REDACTED:{kind}]"))
    out, pos = [], 0
    for a, b, replacement in sorted(edits):
        if a >= pos:  # two parts in one escaped string replace it once
            out += [text[pos:a], replacement]
            pos = b
    out.append(text[pos:])
    return "".join(out)
