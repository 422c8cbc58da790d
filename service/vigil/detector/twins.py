"""Which alerts repeat each other: an aggregate signal's alert raised with a rule's alert that feeds it.

One decision (:func:`twins`) serves every reader: the console folds the aggregate's alert into the
rule's (:func:`fold_twins`); ``GET /v1/alerts`` and ``vigil alerts`` list both and say how they relate
(:func:`mark_twins`). See docs/outcomes-and-alerts.md, "Folded alerts".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vigil.store.db import aware
from vigil.store.signals import FINDING_AGGREGATES

FedBy = Mapping[str, frozenset[str]]


def fed_by_rules(rules: Any) -> dict[str, frozenset[str]]:
    """Each aggregate signal counted from findings (``store.signals.FINDING_AGGREGATES``) with the signals
    (``rule:<id>``) of the loaded rules whose findings it counts: those of the rule type it names. An
    aggregate no loaded rule feeds is left out. ``tool_error`` is never among them (it counts tool results)."""
    out = {
        signal: frozenset(f"rule:{r.id}" for r in rules.rules if r.type.name == kind)
        for signal, kind in FINDING_AGGREGATES.items()
    }
    return {signal: fed for signal, fed in out.items() if fed}


def kin(signal: str, fed_by: FedBy) -> frozenset[str]:
    """``signal`` and the signals whose alerts it can fold with: the rules that feed it (an aggregate) or
    the aggregates it feeds (a rule). What a page narrowed to ``signal`` reads before it folds."""
    feeds = {aggregate for aggregate, fed in fed_by.items() if signal in fed}
    return frozenset({signal, *fed_by.get(signal, ()), *feeds})


def _start(a: Mapping[str, Any]) -> tuple[Any, ...]:
    return (a["agent_id"], a["agent_version"], aware(a["started_at"]), a["rate_at_start"], a["observations_at_start"])


def twins(alerts: list[dict[str, Any]], fed_by: FedBy) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The pairs ``(aggregate's alert, rule's alert)`` among ``alerts`` where the rule's repeats the aggregate's.

    ``fed_by`` maps an aggregate signal to the rule signals whose findings it counts (:func:`fed_by_rules`):
    the aggregate fails a conversation with a finding of any of them, so each rule's conversations are a
    subset of the aggregate's. A rule's alert raised in the same detector run, on the same version, with the
    same count of the same traffic, therefore flags the very conversations the aggregate does (only that rule
    made it fail): on-call saw one regression as two alerts. An aggregate's alert pairs only with a rule that
    feeds it (``rule:pii`` with the same count as ``forbidden_tool`` is a coincidence), and only while both
    are active or both have ended. ``tool_error`` pairs with nothing, ``rule:tool-errors`` included: it
    counts failed tool results, not findings, so that rule's conversations are not a subset of its own and
    an equal count proves nothing."""
    rules: dict[tuple[Any, ...], dict[str, Any]] = {}
    for a in alerts:
        for aggregate, fed in fed_by.items():
            if a["signal"] in fed:
                rules.setdefault((aggregate, *_start(a)), a)
    out = []
    for a in alerts:
        rule = rules.get((a["signal"], *_start(a))) if a["signal"] in fed_by else None
        if rule is not None and rule["active"] == a["active"]:
            out.append((a, rule))
    return out


def fold_twins(alerts: list[dict[str, Any]], fed_by: FedBy) -> list[dict[str, Any]]:
    """The alerts with each aggregate alert that a rule's alert repeats (:func:`twins`) folded into that
    rule's, as ``twins``: the console's one item per regression. The rule's alert is the one shown: it says
    what failed, and its queue link narrows to it."""
    folded = set()
    for aggregate, rule in twins(alerts, fed_by):
        rule.setdefault("twins", []).append(aggregate)
        folded.add(id(aggregate))
    return [a for a in alerts if id(a) not in folded]


def mark_twins(alerts: list[dict[str, Any]], fed_by: FedBy, beside: Sequence[dict[str, Any]] = ()) -> None:
    """Sets on each of ``alerts`` how it relates to the others, hiding none: ``folded_into`` (the id of the
    rule's alert that repeats this aggregate's alert, else None) and ``folds`` (the ids of the aggregates'
    alerts this rule's alert repeats, else empty), as the console folds them. ``beside`` are alerts that
    may pair with them but are not listed (past a page's end); they are not marked."""
    for a in alerts:
        a["folded_into"], a["folds"] = None, []
    listed = {id(a) for a in alerts}
    for aggregate, rule in twins([*alerts, *beside], fed_by):
        if id(aggregate) in listed:
            aggregate["folded_into"] = rule["id"]
        if id(rule) in listed:
            rule["folds"].append(aggregate["id"])
