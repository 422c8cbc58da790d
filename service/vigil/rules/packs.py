"""Rule packs: operator-edited YAML that selects registered rule types and gives their arguments."""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vigil import config_files
from vigil.errors import ConfigError
from vigil.rules.budget import WATCHDOG, Guard, RuleTimeout
from vigil.rules.registry import Evidence, Hit, RuleArgs, RuleError, RuleType, get_rule_type
from vigil.rules.view import ConversationView
from vigil.schema import SEVERITY_RANK, Conversation, Severity

log = logging.getLogger(__name__)


class AppliesTo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # an empty list would scope the rule to nothing: it loaded, and never ran on any conversation
    agents: list[str] = Field(default_factory=lambda: ["*"], min_length=1, description="Glob patterns of agent ids.")
    versions: list[str] = Field(default_factory=lambda: ["*"], min_length=1, description="Glob patterns of versions.")

    def matches(self, agent: str, version: str) -> bool:
        return any(fnmatch.fnmatchcase(agent, p) for p in self.agents) and any(
            fnmatch.fnmatchcase(version, p) for p in self.versions
        )


class RuleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    type: str
    severity: Severity = "medium"
    description: str = ""
    enabled: bool = True
    applies_to: AppliesTo = Field(default_factory=AppliesTo)
    args: dict[str, Any] = Field(default_factory=dict)


class PackSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pack: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    version: int = 1
    description: str = ""
    rules: list[RuleSpec] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Finding:
    rule_id: str
    rule_type: str
    severity: str
    message: str
    evidence: tuple[Evidence, ...]
    details: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule_id": self.rule_id,
            "rule_type": self.rule_type,
            "severity": self.severity,
            "message": self.message,
            "evidence": [e.as_dict() for e in self.evidence],
            "details": self.details,
        }


@dataclass(frozen=True, slots=True)
class CompiledRule:
    id: str
    pack: str
    spec: RuleSpec
    type: RuleType
    args: RuleArgs

    @property
    def description(self) -> str:
        """What the rule checks: its pack's words, else the first line of its rule type's doc."""
        if self.spec.description:
            return self.spec.description
        return " ".join(self.type.doc.split("\n\n")[0].replace("``", "").split())


def _fmt(exc: ValidationError, prefix: str = "") -> str:
    return "; ".join(f"{prefix}{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors())


def _fmt_pack(data: Any, exc: ValidationError) -> str:
    """Errors inside ``rules`` name the rule by its id (or position), then the field."""
    parts = []
    rules = data.get("rules") if isinstance(data, dict) else None
    for e in exc.errors():
        loc = e["loc"]
        if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int) and isinstance(rules, list):
            item = rules[loc[1]]
            rid = item.get("id") if isinstance(item, dict) else None
            who = f"rule {rid!r}" if isinstance(rid, str) else f"rules[{loc[1]}]"
            parts.append(f"{who}: {'.'.join(str(p) for p in loc[2:]) or '(rule)'}: {e['msg']}")
        else:
            parts.append(f"{'.'.join(str(p) for p in loc) or '(root)'}: {e['msg']}")
    return "; ".join(parts)


def load_pack(path: Path) -> tuple[PackSpec, list[CompiledRule]]:
    """Validate one pack file; every error names the file, the rule id and the field."""
    try:
        data = config_files.load(path)
    except UnicodeDecodeError as exc:
        where = f"byte {exc.object[exc.start]:#04x} at offset {exc.start}"
        raise ConfigError(f"{path}: cannot read rule pack: not UTF-8 text ({where})") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read rule pack: {exc}") from None
    try:
        pack = PackSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_fmt_pack(data, exc)}") from None
    compiled: list[CompiledRule] = []
    seen: set[str] = set()
    for spec in pack.rules:
        where = f"{path}: rule {spec.id!r}"
        if spec.id in seen:
            raise ConfigError(f"{where}: id: duplicate rule id in this pack")
        seen.add(spec.id)
        try:
            rtype = get_rule_type(spec.type)
        except RuleError as exc:
            raise ConfigError(f"{where}: type: {exc}") from None
        try:
            args = rtype.args_model.model_validate(spec.args)
        except ValidationError as exc:
            raise ConfigError(f"{where}: {_fmt(exc, 'args.')}") from None
        if spec.enabled:
            compiled.append(CompiledRule(spec.id, pack.pack, spec, rtype, args))
    return pack, compiled


@dataclass(frozen=True, slots=True)
class LoadedPack:
    path: Path
    spec: PackSpec
    rules: list[CompiledRule]  # the enabled ones


def load_packs(paths: list[Path]) -> list[LoadedPack]:
    """Each pack file validated, in order, rule ids unique across them; the first error names the file."""
    loaded: list[LoadedPack] = []
    origin: dict[str, Path] = {}
    for p in paths:
        spec, rules = load_pack(p)
        for rule in rules:
            if rule.id in origin:
                raise ConfigError(f"{p}: rule {rule.id!r}: id: already defined in {origin[rule.id]}")
            origin[rule.id] = p
        loaded.append(LoadedPack(p, spec, rules))
    return loaded


class RuleEngine:
    """Runs every applicable rule of the loaded packs on a conversation."""

    def __init__(self, rules: list[CompiledRule]) -> None:
        ids = [r.id for r in rules]
        dupes = {i for i in ids if ids.count(i) > 1}
        if dupes:
            raise ConfigError(f"rule ids must be unique across packs; repeated: {', '.join(sorted(dupes))}")
        self.rules = rules
        self.timeout_seconds = 1.0  # each rule's budget per conversation (VIGIL_RULE_TIMEOUT_MS)
        self.max_hits = 50  # findings one rule stores per conversation (VIGIL_RULE_MAX_HITS)
        self._applicable: dict[tuple[str, str], list[CompiledRule]] = {}

    @classmethod
    def from_paths(cls, paths: list[Path]) -> RuleEngine:
        return cls.from_packs(load_packs(paths))

    @classmethod
    def from_packs(cls, packs: list[LoadedPack]) -> RuleEngine:
        """The engine of packs :func:`load_packs` read."""
        return cls([rule for pack in packs for rule in pack.rules])

    def rules_for(self, agent: str, version: str) -> list[CompiledRule]:
        key = (agent, version)
        found = self._applicable.get(key)
        if found is None:
            found = [r for r in self.rules if r.spec.applies_to.matches(agent, version)]
            if len(self._applicable) > 10_000:
                self._applicable.clear()
            self._applicable[key] = found
        return found

    def evaluate(self, conversation: Conversation) -> list[Finding]:
        view = ConversationView(conversation)
        findings: list[Finding] = []
        budget = self.timeout_seconds
        guard = WATCHDOG.guard()
        try:
            for rule in self.rules_for(conversation.agent_id, conversation.agent_version):
                hits = self._run(rule, view, guard, budget, findings)
                severity = rule.spec.severity
                for hit in hits[: self.max_hits]:
                    findings.append(
                        Finding(rule.id, rule.type.name, severity, hit.message, tuple(hit.evidence), hit.details)
                    )
                if len(hits) > self.max_hits:
                    findings[-1] = _with_hits_left_out(findings[-1], len(hits) - self.max_hits)
        finally:
            guard.close()
        return findings

    def _run(
        self, rule: CompiledRule, view: ConversationView, guard: Guard, budget: float, findings: list[Finding]
    ) -> list[Hit]:
        """The rule's hits, or none and an error finding (it raised, or ran past its budget)."""
        cid = view.conversation.conversation_id
        try:
            guard.start(budget)
            try:
                hits = list(rule.type.fn(view, rule.args))
            finally:
                timed_out = guard.stop()
            if not timed_out:
                return hits
        except RuleTimeout:
            guard.stop()
        except Exception as exc:  # a broken rule must not stop the stream
            log.exception("rule %s failed on %s", rule.id, cid)
            message = f"rule error: {type(exc).__name__}: {exc}"
            findings.append(Finding(rule.id, rule.type.name, "info", message, (), {"rule_error": True}))
            return []
        log.warning("rule %s ran past its budget of %.0f ms on %s", rule.id, budget * 1000, cid)
        message = f"rule error: rule_timeout: stopped after its budget of {budget * 1000:.0f} ms"
        details = {"rule_error": True, "rule_timeout": True}
        findings.append(Finding(rule.id, rule.type.name, "info", message, (), details))
        return []


def _with_hits_left_out(last: Finding, left_out: int) -> Finding:
    """The last stored finding of a rule that hit more often than it may store, saying how many more."""
    message = f"{last.message} (and {left_out} more of this rule in this conversation, not stored)"
    return replace(last, message=message, details={**last.details, "hits_not_stored": left_out})


def max_severity(findings: list[Finding]) -> str | None:
    real = [f for f in findings if not f.details.get("rule_error")]
    return max((f.severity for f in real), key=SEVERITY_RANK.__getitem__, default=None)
