"""The flagging policy: which signals put a conversation in the review queue, and with what weight.

Loaded from YAML (``VIGIL_REVIEW_POLICY``, default ``service/vigil/review/flagging.yaml``). The policy only
weighs signals; the flagger stores the resulting reasons. Sampling and the choice of multi-reviewer
items hash the conversation id with a versioned salt, so every replica and replay decides alike.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vigil import config_files
from vigil.errors import ConfigError
from vigil.rules import SEVERITY_RANK
from vigil.schema import SUCCESS_TOLERANCE
from vigil.store.signals import OFFLINE_SUFFIX

DEFAULT_POLICY = Path(__file__).resolve().parent / "flagging.yaml"
LABELS = ("confirmed_failure", "not_a_failure", "unsure")
DEFAULT_RUBRIC = {
    "confirmed_failure": "The agent got it wrong in a way the user or the business cares about; pick the category.",
    "not_a_failure": "The flag was wrong: the agent did what it should have done.",
    "unsure": "The transcript does not settle it; say what is missing in the notes.",
}
SEVERITIES = tuple(SEVERITY_RANK)
# the kinds of Reason an item is flagged for (the queue's reason filter takes one of them)
REASON_KINDS = ("finding", "judge_fail", "judge_low_score", "outcome", "sample", "manual")


@dataclass(frozen=True, slots=True)
class Reason:
    """One signal that flags a conversation: kind (finding, judge_fail, ...), key (rule id, judge, type)."""

    kind: str
    key: str
    weight: float
    detail: str = ""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FindingsPolicy(_Strict):
    severity: dict[str, float] = Field(
        default_factory=lambda: dict[str, float]({"critical": 100, "high": 60, "medium": 30})
    )
    rules: dict[str, float] = Field(default_factory=dict)

    @field_validator("severity")
    @classmethod
    def _known(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = set(v) - set(SEVERITY_RANK)
        if unknown:
            raise ValueError(f"unknown severities {sorted(unknown)}; use {list(SEVERITY_RANK)}")
        return v


class JudgePolicy(_Strict):
    fail: float = 70
    low_score_below: float | None = 0.5
    low_score: float = 40
    include_offline: bool = True


class OutcomeRule(_Strict):
    weight: float
    below: float | None = None
    above: float | None = None

    def matches(self, value: float) -> bool:
        if self.below is not None:
            # the vocabulary's slack: a reward of 0.9999999 is a full reward (schema.OutcomeType.happened)
            return value < self.below - SUCCESS_TOLERANCE
        if self.above is not None:
            return value > self.above
        return value > 0


class SamplePolicy(_Strict):
    rate: float = Field(default=0.02, ge=0, le=1)
    salt: str = "review-sample-v1"
    weight: float = 5


class MultiReviewPolicy(_Strict):
    share: float = Field(default=0.0, ge=0, le=1)
    reviewers: int = Field(default=2, ge=1, le=10)
    salt: str = "multi-review-v1"


class FlaggingPolicy(_Strict):
    version: int = 1
    findings: FindingsPolicy = FindingsPolicy()
    judge: JudgePolicy = JudgePolicy()
    outcomes: dict[str, OutcomeRule] = Field(default_factory=dict)
    sample: SamplePolicy = SamplePolicy()
    multi_review: MultiReviewPolicy = MultiReviewPolicy()
    taxonomy: dict[str, str] = Field(default_factory=lambda: {"other": "Something else"})
    rubric: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_RUBRIC))

    @field_validator("rubric")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = set(v) - set(LABELS)
        if unknown:
            raise ValueError(f"unknown labels {sorted(unknown)}; use {list(LABELS)}")
        return {**DEFAULT_RUBRIC, **v}

    @field_validator("outcomes", mode="before")
    @classmethod
    def _weights(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: {"weight": w} if isinstance(w, int | float) else w for k, w in v.items()}
        return v

    @field_validator("taxonomy")
    @classmethod
    def _nonempty(cls, v: dict[str, str]) -> dict[str, str]:
        if not v:
            raise ValueError("the taxonomy needs at least one category")
        return v

    @classmethod
    def load(cls, path: str | Path | None = None) -> FlaggingPolicy:
        """Read and validate a policy file; a bad file raises ConfigError naming the file and field."""
        p = Path(path) if path else DEFAULT_POLICY
        try:
            data = config_files.load(p) or {}
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"flagging policy {p}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
            ) from exc
        except OSError as exc:
            raise ConfigError(f"flagging policy {p}: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"flagging policy {p}: not valid YAML: {exc}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise ConfigError(f"flagging policy {p}: {where}: {first['msg']}") from exc

    def check_outcome_types(self, known: Iterable[str], source: str = "flagging policy") -> None:
        """Refuse outcome keys outside the outcome vocabulary: such a key would never flag anything."""
        known = set(known)
        unknown = sorted(set(self.outcomes) - known)
        if unknown:
            hint = " (benchmark importers write the reward as task_success)" if "reward" in unknown else ""
            raise ConfigError(
                f"{source}: outcomes: {', '.join(map(repr, unknown))} not an outcome type Vigil knows{hint}; "
                f"known: {', '.join(sorted(known))}; declare others in VIGIL_OUTCOME_TYPES"
            )

    def unknown_rules(self, known: Iterable[str]) -> list[str]:
        """``findings.rules`` entries that name no rule of ``known``, each with a close id if there is one:
        such a weight applies to nothing (a misspelt id's rule keeps its severity's weight)."""
        known = sorted(set(known))
        out = []
        for rule in sorted(set(self.findings.rules) - set(known)):
            close = difflib.get_close_matches(rule, known, n=1)
            out.append(f"{rule!r} (did you mean {close[0]!r}?)" if close else repr(rule))
        return out

    def finding_reasons(self, findings: Any) -> list[Reason]:
        """Reasons from rule findings (objects or dicts with rule_id, severity, message)."""
        out: dict[str, Reason] = {}
        for f in findings:
            get: Callable[[str], Any] = f.get if isinstance(f, dict) else partial(getattr, f)
            details = get("details") or {}
            if details.get("rule_error"):
                continue
            rule, severity = get("rule_id"), get("severity")
            weight = self.findings.rules.get(rule, self.findings.severity.get(severity, 0.0))
            if weight > 0 and (rule not in out or out[rule].weight < weight):
                out[rule] = Reason("finding", rule, weight, f"{severity}: {get('message')}"[:500])
        return list(out.values())

    def verdict_reasons(
        self, judge: str, verdict: str, score: float | None, offline: bool, rationale: str | None = None
    ) -> list[Reason]:
        if offline and not self.judge.include_offline:
            return []
        # an offline verdict is its own reason, named as compare names its signal: every view of the
        # queue (chips, clusters, the API) then says the heuristic judge flagged it, not the model
        key = judge + OFFLINE_SUFFIX if offline else judge
        note = (rationale or "")[:500]
        if verdict == "fail" and self.judge.fail > 0:
            return [Reason("judge_fail", key, self.judge.fail, note)]
        below = self.judge.low_score_below
        if verdict == "pass" and score is not None and below is not None and score < below and self.judge.low_score > 0:
            return [Reason("judge_low_score", key, self.judge.low_score, f"score {score:g}: {note}")]
        return []

    def outcome_reasons(self, type_: str, value: float) -> list[Reason]:
        rule = self.outcomes.get(type_)
        if rule is None or rule.weight <= 0 or not rule.matches(value):
            return []
        return [Reason("outcome", type_, rule.weight, f"{type_} = {value:g}")]

    def sampled(self, conversation_id: str) -> bool:
        return _fraction(self.sample.salt, conversation_id) < self.sample.rate

    def reviewers_for(self, conversation_id: str) -> int:
        m = self.multi_review
        return m.reviewers if _fraction(m.salt, conversation_id) < m.share else 1


def _fraction(salt: str, key: str) -> float:
    digest = hashlib.sha256(f"{salt}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
