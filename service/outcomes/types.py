"""Outcome types: the built-in ones and custom ones declared in ``VIGIL_OUTCOME_TYPES``.

A type's kind says how it reads: ``bad`` events (escalation) are worse when more frequent, ``good``
events (thumbs_up, task_success) are better when more frequent, and ``score`` types (csat) carry a
value whose mean is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError

Kind = Literal["bad", "good", "score"]
KINDS: tuple[Kind, ...] = ("bad", "good", "score")

BUILTIN: dict[str, Kind] = {
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
    types = {name: OutcomeType(name, kind) for name, kind in BUILTIN.items()}
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        name, _, kind = entry.partition(":")
        name, kind = name.strip(), (kind.strip() or "bad")
        if not name or len(name) > 64 or not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"VIGIL_OUTCOME_TYPES: {name!r} must be 1-64 letters, digits, _ or -")
        if kind not in KINDS:
            raise ConfigError(
                f"VIGIL_OUTCOME_TYPES: kind of {name!r} must be bad, good or score, not {kind!r}"
            )
        types[name] = OutcomeType(name, kind)  # type: ignore[arg-type]
    return types
