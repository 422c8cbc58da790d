"""One outcome vocabulary: the flagging policy names the outcome types importers write, so a failed
benchmark run reaches the review queue by its outcome (real τ² results files)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from tests.support.review import review_runtime
from tests.support.services import shared_data
from vigil.errors import ConfigError
from vigil.ingest.importers import load_file
from vigil.review.models import ReviewReasonRow
from vigil.review.policy import FlaggingPolicy
from vigil.runtime import Runtime
from vigil.schema import BUILTIN_OUTCOMES, outcome_types

TAU2_FILES = [
    "sierra_gpt-4.1_airline_default_gpt-4.1_1trials.json",
    "sierra_gpt-4.1_retail_defautl_gpt-4.1_1trials.json",
    "sierra_gpt-4.1_telecom_default_gpt-4.1_1trials.json",
    "sierra_testrun1_gpt-4.1-2025-04-14_telecom_no-user_gpt-4.1-2025-04-14_4trials_5tasks.json",
]


@pytest.fixture
def rt(sqlite_url: str) -> Iterator[Runtime]:
    import vigil.outcomes.wiring as outcomes_wiring

    runtime = review_runtime(sqlite_url)
    outcomes_wiring.wire(runtime)  # inline outcomes reach the flagger through the outcome join
    yield runtime
    runtime.close()


def test_default_policy_speaks_the_outcome_vocabulary() -> None:
    policy = FlaggingPolicy.load()
    assert set(policy.outcomes) <= set(BUILTIN_OUTCOMES)
    assert "task_success" in policy.outcomes and "reward" not in policy.outcomes
    policy.check_outcome_types(outcome_types(""))
    # a full reward, with float noise, is a success; anything below is a failed run
    assert policy.outcome_reasons("task_success", 1.0) == []
    assert policy.outcome_reasons("task_success", 0.9999999) == []
    assert [r.key for r in policy.outcome_reasons("task_success", 0.0)] == ["task_success"]


def test_policy_naming_an_unknown_outcome_type_is_refused(tmp_path, sqlite_url) -> None:
    p = tmp_path / "policy.yaml"
    p.write_text("outcomes: {reward: {weight: 40, below: 1.0}}\n")
    policy = FlaggingPolicy.load(p)
    with pytest.raises(ConfigError, match="'reward' not an outcome type.*task_success"):
        policy.check_outcome_types(outcome_types(""), str(p))
    with pytest.raises(ConfigError, match="reward"):
        review_runtime(sqlite_url, review_policy=str(p))
    # a custom type declared in VIGIL_OUTCOME_TYPES is part of the vocabulary
    policy.check_outcome_types(outcome_types("reward:good"))
    review_runtime(sqlite_url, review_policy=str(p), outcome_types="reward:good").close()


def test_failed_tau2_runs_are_queued_by_their_outcome(rt: Runtime) -> None:
    expected_failed: set[str] = set()
    passed: set[str] = set()
    for name in TAU2_FILES:
        path = shared_data("tau2", "trajectories", name)
        raw = json.loads(path.read_text())
        convs = list(load_file(path, "tau2"))
        assert len(convs) == len(raw["simulations"])
        for conv, sim in zip(convs, raw["simulations"], strict=True):
            reward = (sim.get("reward_info") or {}).get("reward")
            if reward is None:
                continue
            (expected_failed if reward < 1.0 else passed).add(conv.conversation_id)
        rt.pipeline.process(convs, "import")
    assert expected_failed and passed  # the files hold both kinds of run
    with rt.sessions() as s:
        by_outcome = set(
            s.scalars(
                select(ReviewReasonRow.conversation_id).where(
                    ReviewReasonRow.kind == "outcome", ReviewReasonRow.key == "task_success"
                )
            )
        )
    assert by_outcome == expected_failed
    assert not by_outcome & passed


def test_policy_weighing_a_rule_no_pack_defines_is_said_at_start_and_by_the_check(tmp_path, sqlite_url, caplog) -> None:  # type: ignore[no-untyped-def]
    """`findings.rules: {retail-cancel-only-pendng: 100}` (a misspelt rule id) loaded without a word: the
    weight applied to nothing and the rule kept its severity's. Start-up logs a warning naming the id and
    the close one, and `vigil review policy` prints it."""
    from tests.support.cli import cli_runner
    from vigil.app.cli import app

    p = tmp_path / "policy.yaml"
    p.write_text("findings:\n  rules: {retail-cancel-only-pendng: 100}\n")
    from vigil.settings import PROJECT_ROOT

    packs = str(PROJECT_ROOT / "rules" / "tau2_retail.yaml")
    with caplog.at_level("WARNING", logger="vigil.review.stage"):
        review_runtime(sqlite_url, review_policy=str(p), rule_packs=packs).close()
    said = "'retail-cancel-only-pendng' (did you mean 'retail-cancel-only-pending'?)"
    assert any(said in r.getMessage() and str(p) in r.getMessage() for r in caplog.records), caplog.text
    env = {"VIGIL_DATABASE_URL": sqlite_url, "VIGIL_RULE_PACKS": packs}
    result = cli_runner().invoke(app, ["review", "policy", str(p)], env=env)
    assert result.exit_code == 0, result.output
    assert f"warning: findings.rules names no enabled rule of VIGIL_RULE_PACKS: {said}" in result.output
