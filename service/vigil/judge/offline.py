"""The offline judge: a deterministic stand-in used when no provider key is configured.

It reads what Vigil already knows about the conversation and never calls a model:

- every rule finding at or above the judge's ``offline.fail_at_severity`` fails the conversation, with
  the category ``offline.category_map`` gives the finding's rule id or rule type (else
  ``offline.default_category``);
- a conversation whose last message is not a non-empty assistant reply fails as ``default_category``
  (the agent never answered). A closing user turn that only ends the session is not counted as the
  last message: one carrying a benchmark stop marker (``###STOP###``, ``###TRANSFER###``,
  ``###OUT-OF-SCOPE###``, as τ²-bench's simulated users end), or the final user turn when
  ``metadata.termination_reason`` is ``user_stop``;
- a tool error rate above one half fails as ``default_category``.

The score starts at 1 and loses 0.1 / 0.25 / 0.5 / 0.8 / 0 per finding of severity low / medium / high /
critical / info and 0.3 per failed heuristic, floored at 0. Its verdicts carry ``offline = true`` and
model ``offline-judge``, and every view labels them "offline judge".
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from vigil.judge.definitions import Judge
from vigil.judge.parse import Parsed
from vigil.rules import SEVERITY_RANK
from vigil.schema import Conversation, Message
from vigil.store.models import FindingRow

STOP_MARKERS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
OFFLINE_MODEL = "offline-judge"
OFFLINE_VERSION = "1"
OFFLINE_LABEL = "offline judge"
_PENALTY = {"info": 0.0, "low": 0.1, "medium": 0.25, "high": 0.5, "critical": 0.8}


def offline_prompt_hash(judge: Judge) -> str:
    o = judge.spec.offline
    key = f"{OFFLINE_MODEL}:{OFFLINE_VERSION}:{judge.version}:{o.model_dump_json()}"
    return hashlib.sha256(key.encode()).hexdigest()


def findings_of(session: Session, conversation_id: str) -> list[tuple[str, str, str, str]]:
    rows = session.execute(
        select(FindingRow.rule_id, FindingRow.rule_type, FindingRow.severity, FindingRow.message).where(
            FindingRow.conversation_id == conversation_id
        )
    ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def final_message(conv: Conversation) -> Message:
    """The last message, skipping closing user turns that only end the session (see the module doc)."""
    msgs = conv.messages
    end = len(msgs)
    if end > 1 and msgs[-1].role == "user" and conv.metadata.get("termination_reason") == "user_stop":
        end -= 1
    while end > 1 and msgs[end - 1].role == "user" and any(s in msgs[end - 1].text for s in STOP_MARKERS):
        end -= 1
    return msgs[end - 1]


def offline_verdict(judge: Judge, conv: Conversation, findings: list[tuple[str, str, str, str]]) -> Parsed:
    """Deterministic verdict from rule findings and two transcript heuristics (see the module doc)."""
    o = judge.spec.offline
    floor = SEVERITY_RANK[o.fail_at_severity]
    score = 1.0
    failing: list[str] = []
    categories: list[str] = []
    for rule_id, rule_type, severity, _message in sorted(findings):
        score -= _PENALTY.get(severity, 0.0)
        if SEVERITY_RANK.get(severity, 0) >= floor:
            failing.append(f"{rule_id} ({severity})")
            categories.append(o.category_map.get(rule_id) or o.category_map.get(rule_type) or o.default_category)
    last = final_message(conv)
    if conv.status != "in_progress" and (last.role != "assistant" or not last.text.strip()):
        score -= 0.3
        failing.append("no final assistant reply")
        categories.append(o.default_category)
    results = [m for m in conv.messages if m.role == "tool"]
    errors = sum(1 for m in results if m.is_error)
    if results and errors / len(results) > 0.5:
        score -= 0.3
        failing.append(f"{errors} of {len(results)} tool calls failed")
        categories.append(o.default_category)
    score = round(max(0.0, score), 4)
    if failing:
        # one entry per rule and severity, counted: a rule firing 1,450 times in one conversation filled the
        # rationale with its name 1,450 times over
        counted: dict[str, int] = {}
        for reason in failing:
            counted[reason] = counted.get(reason, 0) + 1
        parts = [reason if n == 1 else f"{reason} ×{n}" for reason, n in counted.items()]
        rationale = f"{OFFLINE_LABEL}: fails on " + "; ".join(parts)
        return Parsed("fail", score, list(dict.fromkeys(categories)), rationale[:2000])
    return Parsed("pass", score, [], f"{OFFLINE_LABEL}: no finding at or above {o.fail_at_severity}")


def offline_raw(parsed: Parsed) -> str:
    body: dict[str, Any] = {
        "verdict": parsed.verdict,
        "score": parsed.score,
        "categories": parsed.categories,
        "rationale": parsed.rationale,
    }
    return orjson.dumps(body).decode()


def offline_pairwise(input_text: str, first: str, second: str) -> str:
    """Prefers the answer sharing more words with the input, then the longer one; the same in both orders."""
    words = set(input_text.lower().split())

    def key(answer: str) -> tuple[int, int]:
        return (len(words & set(answer.lower().split())), len(answer.strip()))

    a, b = key(first), key(second)
    return "tie" if a == b else ("1" if a > b else "2")
