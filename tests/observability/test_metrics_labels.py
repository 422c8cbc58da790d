"""Label budgets: traffic-derived values fold to 'other' past the budget; idle ones give their place up."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from vigil.metrics import Metrics


def series(m: Metrics, version: str) -> float | None:
    return m.registry.get_sample_value(
        "vigil_conversations_processed_total", {"agent": "a", "agent_version": version, "source": "http"}
    )


def count(m: Metrics, version: str) -> None:
    m.conversations_processed.labels(m.agent("a"), m.version(version), "http").inc()


def test_versions_past_the_budget_fold_to_other_and_are_counted() -> None:
    m = Metrics(CollectorRegistry(), max_label_values=2)
    for v in ("v1", "v2", "v3", "v4"):
        count(m, v)
    assert series(m, "v1") == series(m, "v2") == 1.0
    assert series(m, "v3") is None and series(m, "other") == 2.0
    assert m.registry.get_sample_value("vigil_label_values_folded_total", {"label": "agent_version"}) == 2.0


def test_an_idle_version_frees_its_place_for_a_new_canary() -> None:
    m = Metrics(CollectorRegistry(), max_label_values=2, label_idle_seconds=0.05)
    count(m, "v1")
    count(m, "v2")
    time.sleep(0.1)
    count(m, "v2")  # still active
    count(m, "canary")
    assert series(m, "canary") == 1.0, "the idle v1 should have given its place up"
    assert series(m, "v1") is None, "the evicted version's series is removed"
    assert series(m, "v2") == 2.0
    count(m, "v9")
    assert series(m, "other") == 1.0


def test_configured_names_never_fold() -> None:
    m = Metrics(CollectorRegistry(), max_label_values=1)
    m.label.admit(["rule-a", "rule-b", "rule-c"])
    assert [m.label(x) for x in ("rule-a", "rule-b", "rule-c")] == ["rule-a", "rule-b", "rule-c"]
    assert m.label("surprise-1") == "surprise-1" and m.label("surprise-2") == "other"
