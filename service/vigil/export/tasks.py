"""One confirmed failure → one eval task in Vigil's native schema (``vigil.eval_task``, version 1).

The task holds the conversation up to the failure point: the message the most severe fired rule points at
(the earliest among equals, moved to the nearest assistant turn), or, when no rule fired (the judge, an
outcome or a reviewer found it), the agent's last turn. The harness replays ``messages`` and grades the
agent's next turn against ``grading``.
Near-duplicates share a ``group_key``: the rule at the failure point, its tool, the user's intent, and
the conversation's task id when it has one.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

from vigil.export.checks import checkable
from vigil.export.grading import criteria, derived_rubric
from vigil.rules import SEVERITY_RANK
from vigil.rules.packs import CompiledRule
from vigil.schema import Conversation, Message, dumps_exact

SCHEMA: Final = "vigil.eval_task"
SCHEMA_VERSION: Final = 2  # 2: ``tools`` and ``tools_source``; hard criteria only at or above a severity
_SPACE = re.compile(r"\s+")
_DIGITS = re.compile(r"\d+")


@dataclass(slots=True)
class Source:
    """What the export stage reads about one confirmed failure."""

    conversation: Conversation
    category: str
    findings: list[dict[str, Any]]  # rule_id, rule_type, severity, message, evidence, details
    labels: list[dict[str, Any]]  # the confirming reviewers' label, severity, notes, expected_behavior
    verdicts: list[dict[str, Any]]  # the judges' fail verdicts


def _primary(findings: list[dict[str, Any]]) -> tuple[int, dict[str, Any]] | None:
    """The most severe finding with evidence (the earliest among equals) and the message it points at."""
    best: tuple[tuple[int, int], int, dict[str, Any]] | None = None
    for f in findings:
        ev = f.get("evidence") or []
        if not ev or (f.get("details") or {}).get("rule_error"):
            continue
        idx = int(ev[0]["message_index"])
        key = (-SEVERITY_RANK.get(f["severity"], 0), idx)
        if best is None or key < best[0]:
            best = (key, idx, f)
    return None if best is None else (best[1], best[2])


def failure_index(messages: list[Message], findings: list[dict[str, Any]]) -> tuple[int, dict[str, Any] | None]:
    """Index of the failing assistant turn, and the finding that marks it (None: no rule pointed at one)."""
    assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
    primary = _primary(findings)
    if primary is not None:
        idx, finding = primary
        if idx < len(messages) and messages[idx].role == "assistant":
            return idx, finding
        before = [i for i in assistants if i <= idx]
        after = [i for i in assistants if i > idx]
        if before or after:
            return (before[-1] if before else after[0]), finding
    return (assistants[-1] if assistants else len(messages)), None


def intent_of(conv: Conversation) -> str:
    """The user's intent: the conversation's own, else its goal, else its first user message (normalised)."""
    if conv.intent:
        return conv.intent.strip().lower()
    goal = conv.metadata.get("goal")
    text = (
        goal
        if isinstance(goal, str) and goal.strip()
        else next((m.text for m in conv.messages if m.role == "user" and m.text.strip()), "")
    )
    return _DIGITS.sub("#", _SPACE.sub(" ", text.strip().lower()))[:300]


def group_key(category: str, finding: dict[str, Any] | None, intent: str, task_id: str | None = None) -> str:
    """Near-duplicates share it. A conversation's ``task_id`` names the task it attempts: runs of two tasks
    are two failures however alike their user's words (τ² telecom tasks that share one reason for calling
    differ in the fault behind it), so a task id keeps them apart; without one the key is as it was."""
    if finding is not None:
        parts = ["rule", finding["rule_id"], (finding.get("details") or {}).get("tool") or "", intent]
    else:
        parts = ["category", category, "", intent]
    if task_id:
        parts.append(task_id)
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def _message(m: Message) -> dict[str, Any]:
    return m.model_dump(mode="json", exclude_none=True, exclude={"timestamp"}, exclude_defaults=False)


def _distinct(texts: list[str]) -> list[str]:
    return list(dict.fromkeys(t.strip() for t in texts if t and t.strip()))


def _schema_of(values: list[Any]) -> dict[str, Any]:
    kinds = {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }
    types = sorted({kinds[type(v)] for v in values if type(v) in kinds})
    return {"type": types[0]} if len(types) == 1 else {}


def tools_of(conv: Conversation) -> tuple[list[dict[str, Any]], str | None]:
    """The tools the agent had, as OpenAI function definitions, and where they come from: the definitions
    stored with the conversation (``tools``, or ``metadata.tools`` from traced spans), else the calls seen in
    it (names, and argument names and types from every call), else none."""
    offered = conv.offered_tools
    if offered:
        return [t.as_openai() for t in offered], "conversation"
    seen: dict[str, dict[str, list[Any]]] = {}
    always: dict[str, set[str]] = {}
    for m in conv.messages:
        for call in m.tool_calls or []:
            args = call.args if isinstance(call.args, dict) else {}
            seen.setdefault(call.name, {})
            for k, v in args.items():
                seen[call.name].setdefault(k, []).append(v)
            keys = set(args)
            always[call.name] = always[call.name] & keys if call.name in always else keys
    out = [
        {
            "type": "function",
            "function": {
                "name": name,
                "parameters": {
                    "type": "object",
                    "properties": {k: _schema_of(vs) for k, vs in sorted(params.items())},
                    "required": sorted(always.get(name, set())),
                },
            },
        }
        for name, params in seen.items()
    ]
    return out, ("calls_seen" if out else None)


def hard_findings(findings: list[dict[str, Any]], min_severity: str) -> list[dict[str, Any]]:
    """The findings that become grading criteria: at or above ``min_severity``, and not rule errors (an
    info-level finding, such as a hand-off to a human, is never a criterion)."""
    floor = SEVERITY_RANK[min_severity]
    return [
        f
        for f in findings
        if not (f.get("details") or {}).get("rule_error") and SEVERITY_RANK.get(f["severity"], 0) >= floor
    ]


def build(src: Source, rules: dict[str, CompiledRule], min_severity: str = "medium") -> dict[str, Any]:
    """The native task (not yet redacted). ``src.labels`` may hold a whole near-duplicate group's labels."""
    conv = src.conversation
    tools, tools_source = tools_of(conv)
    idx, finding = failure_index(conv.messages, src.findings)
    expected = "\n\n".join(_distinct([x.get("expected_behavior", "") for x in src.labels]))
    severities = Counter(x["severity"] for x in src.labels if x.get("severity"))
    key = group_key(src.category, finding, intent_of(conv), conv.task_id)
    goal = conv.metadata.get("goal")
    failure = {
        "message_index": idx,
        "failed_turn": _message(conv.messages[idx]) if idx < len(conv.messages) else None,
        "located_by": finding["rule_id"] if finding else None,
        "category": src.category,
        "severity": severities.most_common(1)[0][0] if severities else None,
        "rules": [
            {k: f[k] for k in ("rule_id", "rule_type", "severity", "message")}
            for f in src.findings
            if not (f.get("details") or {}).get("rule_error")
        ],
        "judges": [
            {k: v.get(k) for k in ("judge", "judge_version", "verdict", "categories", "rationale")}
            for v in src.verdicts
        ],
    }
    notes = _distinct([x.get("notes", "") for x in src.labels])
    grading = criteria(hard_findings(src.findings, min_severity), rules, expected)
    if not expected and not checkable(grading):  # else it would pass whatever the model does
        grading.append(derived_rubric(failure, notes))
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "task_id": f"vigil-{key[:20]}",
        "group_key": key,
        "source": {
            "conversation_id": conv.conversation_id,
            "revision": conv.effective_revision,
            "agent_id": conv.agent_id,
            "agent_version": conv.agent_version,
            "task_id": conv.task_id,
        },
        "goal": goal if isinstance(goal, str) else None,
        "intent": conv.intent,
        "messages": [_message(m) for m in conv.messages[:idx]],
        "failure": failure,
        "review": {
            "notes": notes,
            "expected_behavior": expected or None,
        },
        "tools": tools,
        "tools_source": tools_source,
        "grading": grading,
        "duplicates": [],
    }


# Characters JSON may hold raw that line readers take for line breaks (Python's str.splitlines does, and
# so did the verifiers loader: one U+2028 in a conversation made the whole file unloadable). Written as
# JSON escapes, they read back as the same characters.
_LINE_BREAKS = ((b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"), (b"\xc2\x85", b"\\u0085"))


def dumps(task: dict[str, Any]) -> bytes:
    """One JSON line, keys sorted; an integer beyond 64 bits (stored documents keep them exact) is written
    exactly (see :func:`~vigil.schema.dumps_exact`). No character a line reader splits on is left raw."""
    line = dumps_exact(task, sort_keys=True).encode()
    for raw, escaped in _LINE_BREAKS:
        if raw in line:
            line = line.replace(raw, escaped)
    return line + b"\n"
