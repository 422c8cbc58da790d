"""Machine-checkable grading criteria derived from the rules that fired on a failed conversation.

Each criterion is a small JSON object an offline harness can check against the agent's new attempt,
e.g. ``{"type": "must_not_call", "tool": "cancel_order"}``. A rule type without a dedicated shape becomes
``{"type": "rule", "rule_type": ..., "args": ...}`` so a harness with Vigil's rules can still re-run it.
The reviewer's expected behaviour becomes a ``rubric`` criterion for a model grader. A task left with neither
(no expected behaviour written, no finding a harness checks) gets a rubric *derived* from what reviewers
confirmed as the failure (:func:`derived_rubric`), marked ``"derived": true``, so a grader can fail it.
"""

from __future__ import annotations

from typing import Any

from vigil.rules.packs import CompiledRule


def _args(rule: CompiledRule | None) -> dict[str, Any]:
    return rule.args.model_dump(mode="json", exclude_none=True) if rule is not None else {}


def criterion(rule_id: str, rule_type: str, details: dict[str, Any], rule: CompiledRule | None) -> dict[str, Any]:
    """The criterion a finding of ``rule_id`` implies for the agent's next attempt."""
    a = _args(rule)
    tool = details.get("tool")
    shape: dict[str, Any]
    if rule_type == "forbidden_tool":
        shape = {"type": "must_not_call", "tool": tool or (a.get("tools") or [None])[0]}
        if a.get("when"):
            shape["when"] = a["when"]
        if a.get("when_args"):
            shape["when_args"] = a["when_args"]
    elif rule_type == "unoffered_tool":
        shape = {"type": "must_not_call", "tool": tool}
    elif rule_type == "tool_order":
        shape = {
            "type": "must_call_before",
            "before": a.get("before"),
            "after": [tool] if tool else a.get("after"),
        }
        if a.get("same_arg"):
            shape["same_arg"] = a["same_arg"]
    elif rule_type == "require_confirmation":
        shape = {"type": "must_confirm_before_call", "tool": tool or (a.get("tools") or [None])[0]}
    elif rule_type == "pii_leak":
        shape = {
            "type": "must_not_disclose",
            "kinds": [details["kind"]] if details.get("kind") else a.get("kinds"),
        }
    elif rule_type == "regex":
        shape = {
            "type": a.get("mode", "must_not_match"),
            "pattern": a.get("pattern"),
            "roles": a.get("roles", ["assistant"]),
            "ignore_case": a.get("ignore_case", True),
        }
    elif rule_type == "budget":
        shape = {"type": "within_budget", **{k: v for k, v in a.items() if k.startswith("max_")}}
    elif rule_type == "tool_error_rate":
        shape = {
            "type": "max_tool_error_rate",
            "max_rate": a.get("max_rate"),
            "min_calls": a.get("min_calls"),
        }
    elif rule_type == "tool_calls_per_message":
        shape = {"type": "max_tool_calls_per_message", "max_calls": a.get("max_calls")}
    elif rule_type == "escalation":
        shape = {"type": "must_not_escalate", "tools": a.get("tools")}
    elif rule_type == "empty_or_truncated_response":
        shape = {"type": "non_empty_response"}
    elif rule_type == "groundedness":
        shape = {"type": "grounded_in_tool_results"}
    elif rule_type == "user_repetition":
        shape = {"type": "no_user_repetition"}
    else:
        shape = {"type": "rule", "rule_type": rule_type, "args": a}
    return {**shape, "rule_id": rule_id}


def describe(c: dict[str, Any]) -> str:
    """One line a person (or a model grader) can read."""
    t = c["type"]
    if t == "must_not_call":
        return f"Must not call {c['tool']}" + (" under the conditions that forbid it" if c.get("when") else "") + "."
    if t == "must_call_before":
        return f"Must call one of {', '.join(c['before'] or [])} before {', '.join(c['after'] or [])}."
    if t == "must_confirm_before_call":
        return f"Must get the user's explicit confirmation before calling {c['tool']}."
    if t == "must_not_disclose":
        return f"Must not disclose personal data ({', '.join(c['kinds'] or [])})."
    if t in ("must_not_match", "must_match"):
        return f"{'Must not' if t == 'must_not_match' else 'Must'} say anything matching /{c['pattern']}/."
    if t == "rubric":
        return str(c["text"])
    return {
        "within_budget": "Must stay within the turn, tool-call, token, cost and latency budget.",
        "max_tool_error_rate": "Must keep failed tool calls rare.",
        "max_tool_calls_per_message": "Must not make too many tool calls in one message.",
        "must_not_escalate": "Must resolve the request without handing over to a human.",
        "non_empty_response": "Must give a complete, non-empty answer.",
        "grounded_in_tool_results": "Must state only facts the tool results support.",
        "no_user_repetition": "Must not make the user repeat themselves.",
    }.get(t, f"Must not trigger rule {c.get('rule_id')}.")


def criteria(findings: list[dict[str, Any]], rules: dict[str, CompiledRule], expected: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in findings:
        c = criterion(f["rule_id"], f["rule_type"], f.get("details") or {}, rules.get(f["rule_id"]))
        if c not in out:
            out.append(c)
    if expected.strip():
        out.append({"type": "rubric", "text": expected.strip()})
    return out


_PIECE = 600  # characters of each piece of evidence a derived rubric quotes: enough to name a failure, bounded


def _clip(text: str, n: int = _PIECE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _turn(turn: dict[str, Any]) -> str:
    content = turn.get("content")
    if isinstance(content, list):
        content = " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    said = [f'said "{_clip(str(content), 400)}"'] if content else []
    calls = [
        f"called {c['function'].get('name')}({_clip(str(c['function'].get('arguments') or ''), 200)})"
        for c in turn.get("tool_calls") or []
        if isinstance(c.get("function"), dict)
    ]
    return " and ".join(said + calls)


def derived_rubric(failure: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """A rubric for a task no reviewer wrote an expected behaviour for: the reply must not repeat the failure
    reviewers confirmed, in the words of what confirmed it: the category, the reviewers' notes, the fired
    rules' messages (info-level findings, such as a hand-off, are no failure and are left out), the judges'
    rationales, and the failing turn itself when a rule above info located it (the fallback, the agent's last
    turn, may be a harmless goodbye after a failure earlier on, so it is not quoted). ``derived_from`` lists
    which."""
    confirmed = "The reply must not repeat the failure reviewers confirmed in the original conversation"
    parts = [f"{confirmed} ({failure['category']})."]
    used = ["category"]
    if notes:
        parts.append("Reviewers noted: " + " / ".join(_clip(n) for n in notes))
        used.append("notes")
    rules = [r for r in failure.get("rules") or [] if r.get("severity") != "info" and r.get("message")]
    if rules:
        parts.append("Rules that flagged it: " + "; ".join(_clip(str(r["message"]), 300) for r in rules))
        used.append("rules")
    rationales = [j["rationale"] for j in failure.get("judges") or [] if j.get("rationale")]
    if rationales:
        parts.append("The judge found: " + " / ".join(_clip(str(r)) for r in rationales))
        used.append("judges")
    turn = failure.get("failed_turn")
    located = failure.get("located_by") in {r["rule_id"] for r in rules}
    if located and turn and (described := _turn(turn)):
        parts.append(f"The failing turn, not to be repeated: the agent {described}.")
        used.append("failed_turn")
    return {"type": "rubric", "text": " ".join(parts), "derived": True, "derived_from": used}
