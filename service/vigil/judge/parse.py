"""Strict parsing of a judge's reply. Anything but the one expected JSON object is ``unscored`` with a reason.

The reply is never searched for a JSON object inside other text: a verdict-shaped string quoted from
the transcript cannot become the verdict.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import orjson

# A reply the provider ended early does not parse for that reason: cut at the judge's max_tokens (a
# reasoning model can spend them all before writing a word), or stopped by its content filter.
CUT_SHORT = {"length": "truncated", "content_filter": "content_filtered"}
_UNREADABLE = {"empty_reply", "invalid_json", "not_an_object"}
# Replies that are not the verdict object asked for: asked again (VIGIL_JUDGE_REASKS) before they stand. Not
# a reply cut short (the same max_tokens cuts it again), one that abstains, nor one that contradicts itself
# (the object asked for, saying nothing to count)
MALFORMED = _UNREADABLE | {
    "duplicate_keys",
    "unknown_fields",
    "bad_verdict",
    "bad_rationale",
    "bad_score",
    "bad_categories",
}
VERDICT_KEYS = {"verdict", "score", "categories", "rationale"}
PAIRWISE_KEYS = {"winner", "rationale"}
MAX_RATIONALE = 2000


@dataclass(slots=True)
class Parsed:
    verdict: str  # pass | fail | unscored
    score: float | None = None
    categories: list[str] = field(default_factory=list)
    rationale: str | None = None
    unscored_reason: str | None = None

    @staticmethod
    def unscored(reason: str, rationale: str | None = None) -> Parsed:
        return Parsed("unscored", None, [], rationale, reason)


def _object(text: str | None) -> dict[str, Any] | str:
    """The reply as a JSON object, or the unscored reason. One optional ```json fence is tolerated."""
    if text is None or not text.strip():
        return "empty_reply"
    body = text.strip()
    if body.startswith("```"):
        first_nl = body.find("\n")
        if first_nl < 0 or not body.endswith("```") or body[3:first_nl].strip() not in ("", "json"):
            return "invalid_json"
        body = body[first_nl + 1 : -3].strip()
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "invalid_json"
    if not isinstance(value, dict):
        return "not_an_object"
    if _has_duplicate_keys(body):
        return "duplicate_keys"
    return value


class _DuplicateKey(Exception):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _DuplicateKey
    return out


def _has_duplicate_keys(body: str) -> bool:
    """Whether any object in ``body`` (valid JSON) names a key twice: ``{"verdict":"pass", ...,
    "verdict":"fail"}`` is ambiguous, and a parser that keeps the last one would pick a side."""
    if body.count('"') < 4:  # fewer than two keys
        return False
    try:
        json.loads(body, object_pairs_hook=_unique)
    except _DuplicateKey:
        return True
    except (ValueError, RecursionError):  # orjson accepted it; nothing else to learn here
        return False
    return False


def cut_short(unscored_reason: str | None, finish_reason: str | None) -> str | None:
    """``truncated`` or ``content_filtered`` for a reply that could not be read because the provider ended it
    early (its ``finish_reason``), else None: ``invalid_json`` would blame the model for the judge's
    ``max_tokens``."""
    return CUT_SHORT.get(finish_reason or "") if unscored_reason in _UNREADABLE else None


def _rationale(value: Any) -> str | None | bool:
    if value is None:
        return None
    if not isinstance(value, str):
        return False
    return value.strip()[:MAX_RATIONALE]


def parse_verdict(text: str | None, categories: list[str]) -> Parsed:
    obj = _object(text)
    if isinstance(obj, str):
        return Parsed.unscored(obj)
    if set(obj) - VERDICT_KEYS:
        return Parsed.unscored("unknown_fields")
    verdict = obj.get("verdict")
    if verdict not in ("pass", "fail", "unscored"):
        return Parsed.unscored("bad_verdict")
    rationale = _rationale(obj.get("rationale"))
    if rationale is False:
        return Parsed.unscored("bad_rationale")
    if verdict == "unscored":
        return Parsed.unscored("judge_abstained", rationale or None)  # type: ignore[arg-type]
    score = obj.get("score")
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score) or not 0 <= score <= 1:
        return Parsed.unscored("bad_score")
    cats = obj.get("categories", [])
    if not isinstance(cats, list) or not all(isinstance(c, str) and c in categories for c in cats):
        return Parsed.unscored("bad_categories")
    # a reply that contradicts itself says nothing to count: a pass naming failure categories, a pass
    # scored 0 or a fail scored 1 (1 = fully meets the rubric); the rationale is kept for a reader
    if (verdict == "pass" and (cats or score == 0)) or (verdict == "fail" and score == 1):
        return Parsed.unscored("inconsistent", rationale or None)  # type: ignore[arg-type]
    return Parsed(verdict, float(score), list(dict.fromkeys(cats)), rationale or None)  # type: ignore[arg-type]


@dataclass(slots=True)
class PairChoice:
    choice: str | None  # "1" | "2" | "tie", or None when unscored
    rationale: str | None = None
    unscored_reason: str | None = None


def parse_pairwise(text: str | None) -> PairChoice:
    obj = _object(text)
    if isinstance(obj, str):
        return PairChoice(None, None, obj)
    if set(obj) - PAIRWISE_KEYS:
        return PairChoice(None, None, "unknown_fields")
    winner = obj.get("winner")
    if isinstance(winner, int) and not isinstance(winner, bool):
        winner = str(winner)
    if winner not in ("1", "2", "tie"):
        return PairChoice(None, None, "bad_winner")
    rationale = _rationale(obj.get("rationale"))
    if rationale is False:
        return PairChoice(None, None, "bad_rationale")
    return PairChoice(winner, rationale or None)  # type: ignore[arg-type]
