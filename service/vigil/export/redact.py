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
