"""PII redaction applied to every exported task before it leaves Vigil.

Built in: every kind the detector behind the ``pii_leak`` rule knows (:mod:`vigil.rules.pii`: emails
however written, phones, Luhn-valid cards, SSNs, IBANs, IP addresses, dates of birth, street addresses,
keys, tokens and passwords); plus the operator's own patterns from ``VIGIL_EXPORT_REDACT_PATTERNS``,
run on RE2 like every pattern that sees traffic. A match becomes ``[REDACTED:<kind>]``.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from vigil.errors import ConfigError
from vigil.rules import pii
from vigil.rules.patterns import UnsupportedPattern, compile_linear

BUILTIN: list[str] = list(pii.KINDS)
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class Redactor:
    def __init__(self, patterns: dict[str, str] | None = None) -> None:
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

    def text(self, text: str) -> str:
        spans: list[tuple[int, int, str]] = [(f.start, f.end, f.kind) for f in pii.detect(text)]
        for name, rx in self.patterns.items():
            spans.extend((m.start(), m.end(), name) for m in rx.finditer(text) if m.end() > m.start())
        if not spans:
            return text
        spans.sort(key=lambda s: (s[0], -(s[1] - s[0])))
        out, pos = [], 0
        for start, end, kind in spans:
            if start < pos:  # overlaps a longer match already replaced
                continue
            out.append(text[pos:start])
            out.append(f"[REDACTED:{kind}]")
            self.counts[kind] += 1
            pos = end
        out.append(text[pos:])
        return "".join(out)

    def value(self, obj: Any) -> Any:
        """Redact every string inside ``obj`` (dicts, lists, strings), keys left as they are."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {k: self.value(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.value(v) for v in obj]
        return obj


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


def _message(redactor: Redactor, m: Any) -> Any:
    """A message redacted, its tool call ids and the id of the call a tool result answers kept."""
    if not isinstance(m, dict):
        return redactor.value(m)
    out = _except(redactor, m, ("role", "tool_call_id"))
    if isinstance(m.get("tool_calls"), list):
        out["tool_calls"] = [_except(redactor, c, ("id", "type")) for c in m["tool_calls"]]
    return out


def redact_task(redactor: Redactor, task: dict[str, Any]) -> dict[str, Any]:
    """The native task with every string of its content redacted, its identifiers kept as they are."""
    out = _except(redactor, task, _TASK_IDS)
    out["messages"] = [_message(redactor, m) for m in task.get("messages") or []]
    failure = task.get("failure")
    if isinstance(failure, dict):
        red = _except(redactor, failure, _FAILURE_IDS)
        if failure.get("failed_turn") is not None:
            red["failed_turn"] = _message(redactor, failure["failed_turn"])
        red["rules"] = [_except(redactor, r, _RULE_IDS) for r in failure.get("rules") or []]
        red["judges"] = [_except(redactor, j, _JUDGE_IDS) for j in failure.get("judges") or []]
        out["failure"] = red
    return out
