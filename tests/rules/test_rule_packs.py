"""Rule packs: the shipped ones load, bad ones fail naming file, rule and field, plugins work from YAML."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import make_settings
from vigil.app.runtime import build_runtime
from vigil.errors import ConfigError
from vigil.rules import RuleEngine, load_pack, registered_rule_types
from vigil.schema import Conversation
from vigil.settings import PROJECT_ROOT, Settings

SHIPPED = sorted((PROJECT_ROOT / "rules").glob("*.yaml"))


def write(tmp_path: Path, text: str, name: str = "pack.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def load_error(path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        RuleEngine.from_paths([path])
    return str(err.value)


def test_shipped_packs_load_together() -> None:
    names = {p.name for p in SHIPPED}
    assert {"default.yaml", "tau2_airline.yaml", "tau2_retail.yaml", "tau2_telecom.yaml"} <= names
    engine = RuleEngine.from_paths(SHIPPED)
    assert len({r.id for r in engine.rules}) == len(engine.rules)
    retail = {r.id for r in engine.rules_for("tau2-retail", "gpt-4.1")}
    assert "retail-cancel-only-pending" in retail and "airline-cancel-not-eligible" not in retail
    assert "confirm-before-write" in retail  # the default pack applies to every agent
    assert not any(r.pack.startswith("tau2") for r in engine.rules_for("support-bot", "v1"))


def test_every_shipped_rule_says_what_it_checks() -> None:
    """Half the default pack's rules (pii-in-reply, tool-errors, ...) had no description, so the
    conversation page's finding showed no line saying what the rule checks."""
    missing = [
        f"{p.name}: {spec.id}" for p in SHIPPED for spec in load_pack(p)[0].rules if not spec.description.strip()
    ]
    assert not missing, "rules without a description: " + ", ".join(missing)


def test_a_rule_without_a_description_is_described_by_its_type(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        """
        pack: custom
        rules:
          - id: said
            type: escalation
            description: Handed to a person.
          - id: unsaid
            type: tool_calls_per_message
        """,
    )
    said, unsaid = RuleEngine.from_paths([p]).rules
    assert said.description == "Handed to a person."
    assert unsaid.description == (
        "One action at a time: at most max_calls tool calls per assistant message, no text beside them."
    )


def test_tau2_packs_require_confirmation_of_every_write_tool() -> None:
    import json

    from tests.support.services import shared_data

    signatures = json.loads(shared_data("tau2", "domain", "tool_signatures_from_source.json").read_text())
    for domain in ("airline", "retail"):
        writes = {t["name"] for t in signatures[domain] if t["tool_type"].endswith("WRITE")}
        _, rules = load_pack(PROJECT_ROOT / "rules" / f"tau2_{domain}.yaml")
        confirmed = {t for r in rules if r.type.name == "require_confirmation" for t in r.args.tools}
        assert writes == confirmed, domain
        assert all(r.spec.applies_to.agents == [f"tau2-{domain}"] for r in rules)


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_tau2_packs_are_worth_their_alerts_on_the_gpt41_runs(domain: str) -> None:
    """At the severity that queues a conversation for review (medium in the shipped flagging policy), each
    domain pack flags at least 40% of the failed gpt-4.1 runs and fires at least 3 times as often at failure
    as at success (the figures docs/rules.md reports)."""
    from tests.support.services import shared_data
    from vigil.ingest.importers import load_file
    from vigil.schema import SEVERITY_RANK

    name = "defautl" if domain == "retail" else "default"
    path = shared_data("tau2", "trajectories", f"sierra_gpt-4.1_{domain}_{name}_gpt-4.1_1trials.json")
    engine = RuleEngine.from_paths([PROJECT_ROOT / "rules" / f"tau2_{domain}.yaml"])
    counts = {True: [0, 0], False: [0, 0]}  # failed? -> [flagged, total]
    for conv in load_file(Path(path)):
        failed = conv.outcomes[0].value < 1
        findings = [f for f in engine.evaluate(conv) if not f.details.get("rule_error")]
        counts[failed][0] += any(SEVERITY_RANK[f.severity] >= SEVERITY_RANK["medium"] for f in findings)
        counts[failed][1] += 1
    recall = counts[True][0] / counts[True][1]
    at_success = counts[False][0] / counts[False][1]
    assert recall >= 0.4 and recall >= 3 * at_success, counts


def test_docs_document_every_rule_type() -> None:
    page = (PROJECT_ROOT / "docs" / "rules.md").read_text()
    section = page[page.index("<!-- section:rules -->") :]
    for name, rtype in registered_rule_types().items():
        if rtype.fn.__module__.startswith("vigil."):
            assert f"`{name}`" in section, name


def test_bad_yaml_names_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, "pack: x\nrules: [\n  - id: a\n")
    msg = load_error(p)
    assert str(p) in msg and "cannot read rule pack" in msg


def test_unknown_type_names_file_rule_and_field(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        """
        pack: custom
        rules:
          - id: fine
            type: escalation
          - id: typo-rule
            type: forbiden_tool
            args: {tools: [x]}
        """,
    )
    msg = load_error(p)
    assert msg.startswith(f"{p}: rule 'typo-rule': type: unknown rule type 'forbiden_tool'")
    assert "forbidden_tool" in msg  # lists the registered types


def test_bad_args_name_file_rule_and_field(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        """
        pack: custom
        rules:
          - id: cancel-guard
            type: forbidden_tool
            args:
              tools: [cancel_pending_order]
              when: {field: status}
        """,
    )
    msg = load_error(p)
    assert msg.startswith(f"{p}: rule 'cancel-guard': args.when.0: ")
    assert "give at least one of values" in msg

    p = write(
        tmp_path,
        """
        pack: custom
        rules:
          - id: spelled-wrong
            type: budget
            args: {max_turn: 3}
        """,
    )
    assert f"{p}: rule 'spelled-wrong': args.max_turn: Extra inputs are not permitted" in load_error(p)

    p = write(
        tmp_path,
        """
        pack: custom
        rules:
          - id: bad-regex
            type: regex
            args: {pattern: "(unclosed"}
        """,
    )
    assert f"{p}: rule 'bad-regex': args.pattern: " in load_error(p)


def test_bad_rule_fields_name_the_rule(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        """
        pack: custom
        rules:
          - id: ok-rule
            type: escalation
          - id: loud
            type: escalation
            severity: extreme
        """,
    )
    msg = load_error(p)
    assert msg.startswith(f"{p}: rule 'loud': severity: ")
    p = write(
        tmp_path,
        """
        pack: custom
        rules:
          - type: escalation
        """,
    )
    assert f"{p}: rules[0]: id: Field required" in load_error(p)


def test_duplicate_ids_in_one_pack_and_across_packs(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        """
        pack: custom
        rules:
          - id: twice
            type: escalation
          - id: twice
            type: budget
            args: {max_turns: 3}
        """,
    )
    assert load_error(p) == f"{p}: rule 'twice': id: duplicate rule id in this pack"

    first = write(tmp_path, "pack: one\nrules: [{id: shared, type: escalation}]\n", "one.yaml")
    second = write(tmp_path, "pack: two\nrules: [{id: shared, type: escalation}]\n", "two.yaml")
    with pytest.raises(ConfigError, match=re.escape(f"{second}: rule 'shared': id: already defined in {first}")):
        RuleEngine.from_paths([first, second])


def test_disabled_rules_and_version_globs(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        """
        pack: custom
        rules:
          - id: switched-off
            type: escalation
            enabled: false
          - id: canary-only
            type: escalation
            applies_to: {agents: [shop-*], versions: ["2.*"]}
        """,
    )
    engine = RuleEngine.from_paths([p])
    assert [r.id for r in engine.rules] == ["canary-only"]
    assert engine.rules_for("shop-eu", "2.1") and not engine.rules_for("shop-eu", "1.9")
    assert not engine.rules_for("bank", "2.1")


def test_yaml_dates_and_quoted_words_in_conditions(tmp_path: Path) -> None:
    # Unquoted 2024-05-14 is a YAML date; it must compare with the ISO strings tool results carry.
    p = write(
        tmp_path,
        """
        pack: custom
        rules:
          - id: old-booking
            type: forbidden_tool
            args:
              tools: [cancel_reservation]
              when: {field: created_at, less_than: 2024-05-14, join_on: reservation_id}
        """,
    )
    _, [rule] = load_pack(p)
    assert rule.args.when[0].less_than == "2024-05-14"


PLUGIN = '''
from collections.abc import Iterator

from pydantic import Field

from vigil.rules import ConversationView, Evidence, Hit, RuleArgs, rule_type


class ShoutingArgs(RuleArgs):
    min_letters: int = Field(default=10, ge=1)


@rule_type("shouting", ShoutingArgs)
def shouting(view: ConversationView, args: ShoutingArgs) -> Iterator[Hit]:
    """The assistant wrote a whole reply in capitals."""
    for i, text in view.assistant_texts:
        letters = [c for c in text if c.isalpha()]
        if len(letters) >= args.min_letters and all(c.isupper() for c in letters):
            yield Hit("assistant shouted", [Evidence(i, 0, len(text), text[:40])])
'''


def test_plugin_rule_type_from_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> None:
    module = "vigil_test_shouting_plugin"
    (tmp_path / f"{module}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    pack = write(
        tmp_path,
        """
        pack: house
        rules:
          - id: no-shouting
            type: shouting
            severity: low
            args: {min_letters: 5}
        """,
    )
    monkeypatch.setenv("VIGIL_RULE_PLUGINS", module)
    monkeypatch.setenv("VIGIL_RULE_PACKS", str(pack))
    base = make_settings(sqlite_url)
    settings = Settings(database_url=base.database_url, api_keys=base.api_keys, metrics_port=0)
    assert settings.rule_plugins == module and settings.rule_packs == str(pack)
    rt = build_runtime(settings, registry=CollectorRegistry())
    try:
        assert [r.id for r in rt.rules.rules] == ["no-shouting"]
        conv = Conversation.model_validate(
            {
                "conversation_id": "plugin-1",
                "agent_id": "a",
                "agent_version": "1",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "HELLO THERE!"},
                ],
            }
        )
        [finding] = rt.rules.evaluate(conv)
        assert (finding.rule_id, finding.rule_type, finding.severity) == ("no-shouting", "shouting", "low")
        assert finding.evidence[0].as_dict() == {
            "message_index": 1,
            "start": 0,
            "end": 12,
            "quote": "HELLO THERE!",
        }
        quiet = conv.model_copy(update={"messages": conv.messages[:1]})
        assert rt.rules.evaluate(quiet) == []
    finally:
        rt.close()
    assert "shouting" in registered_rule_types()


def test_pack_naming_an_unregistered_plugin_type_fails_at_start(tmp_path: Path, sqlite_url: str) -> None:
    pack = write(tmp_path, "pack: house\nrules: [{id: whisper, type: whispering}]\n")
    with pytest.raises(ConfigError, match=re.escape(f"{pack}: rule 'whisper': type: unknown rule type 'whispering'")):
        build_runtime(make_settings(sqlite_url, rule_packs=str(pack)), registry=CollectorRegistry())


def test_a_pack_two_patterns_name_is_loaded_once() -> None:
    """VIGIL_RULE_PACKS="rules/default.yaml,rules/*.yaml" loaded default.yaml twice, and start-up failed
    on each of its rules clashing with itself ("id already defined in rules/default.yaml")."""
    rules = PROJECT_ROOT / "rules"
    both = f"{rules / 'default.yaml'},{rules}/*.yaml,{rules}/../rules/default.yaml"
    paths = make_settings("sqlite://", rule_packs=both).rule_pack_paths()
    assert len(paths) == len(set(p.resolve() for p in paths)) == len(list(rules.glob("*.yaml")))
    assert paths[0].name == "default.yaml"  # in the order given
    engine = RuleEngine.from_paths(paths)
    assert len(engine.rules) == len(RuleEngine.from_paths(sorted(rules.glob("*.yaml"))).rules)
