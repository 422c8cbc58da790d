"""Offline results of one run of an eval suite, from Inspect logs, τ²-bench results or Vigil's JSONL.

Every reader gives a :class:`Run`: one :class:`Rollout` per (task, attempt) and the run's *protocol*,
what says how the scores were produced (model, sampling, harness, tools, user simulator, grader, rule
packs, budgets). The gate compares two runs only as far as their protocols agree.

Vigil's native results (``vigil.results``, version 1) are JSON Lines: a header line, then one line per
rollout::

    {"format": "vigil.results", "version": 1, "protocol": {"model": "...", "sampling": {...}, ...}}
    {"task_id": "t1", "rollout": 0, "success": true, "error": false, "truncated": false,
     "steps": 7, "cost_usd": 0.012, "latency_ms": 5300, "forbidden_tool": false}
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vigil import ingest
from vigil.compare import protocol_of
from vigil.errors import VigilError
from vigil.evaluation.errors import EvaluationError
from vigil.rules import RuleEngine
from vigil.schema import Conversation

RESULTS_FORMAT = "vigil.results"
RESULTS_VERSION = 1
FORBIDDEN_TYPES = frozenset({"forbidden_tool", "per_entity_limit", "arg_from_lookup", "single_entity"})
PROTOCOL_KEYS = ("model", "sampling", "harness", "tools", "user", "grader", "judge", "rule_packs", "budgets")
TAU2_ERRORS = frozenset({"too_many_errors", "agent_error", "user_error", "invalid_agent_message", "error"})
TAU2_TRUNCATED = frozenset({"max_steps", "max_turns", "timeout"})


@dataclass(slots=True)
class Rollout:
    task_id: str
    success: float | None  # 1.0 pass, 0.0 fail, None unscored
    error: bool = False
    truncated: bool = False
    steps: float | None = None
    cost_usd: float | None = None
    latency_s: float | None = None
    forbidden_tool: bool | None = None  # None: not measured


@dataclass
class Run:
    path: Path
    format: str
    rollouts: list[Rollout]
    protocol: dict[str, str | None] = field(default_factory=dict)

    def by_task(self, value: str) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for r in self.rollouts:
            v = getattr(r, value)
            if v is not None:
                out.setdefault(r.task_id, []).append(float(v))
        return out


def _canon(value: Any) -> str | None:
    if value is None or value == {} or value == []:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _packs_version(engine: RuleEngine) -> str:
    """The rules behind ``forbidden_tool``: their packs and a digest of their ids, types, severities and args."""
    rules = sorted(
        (r.pack, r.id, r.type.name, r.spec.severity, r.args.model_dump_json())
        for r in engine.rules
        if r.type.name in FORBIDDEN_TYPES
    )
    if not rules:
        return "none"
    digest = hashlib.sha256(orjson.dumps(rules)).hexdigest()[:12]
    return f"{len(rules)} rules of {', '.join(sorted({r[0] for r in rules}))} (sha256 {digest})"


def _forbidden(engine: RuleEngine, conv: Conversation) -> bool:
    return any(f.rule_type in FORBIDDEN_TYPES and not f.details.get("rule_error") for f in engine.evaluate(conv))


def _steps(conv: Conversation) -> int:
    return sum(1 for m in conv.messages if m.role == "assistant")


# --- τ²-bench results -----------------------------------------------------------------------------------


def _tau2(path: Path, data: dict[str, Any], engine: RuleEngine) -> Run:
    info = data.get("info") or {}
    agent = info.get("agent_info") or {}
    user = info.get("user_info") or {}
    env = info.get("environment_info") or {}
    sims = {str(s.get("id")): s for s in data.get("simulations") or []}
    rollouts = []
    bases: set[str] = set()
    try:
        convs = list(ingest.load_file(path, "tau2"))
    except VigilError as exc:
        raise EvaluationError(str(exc)) from None
    for conv in convs:
        sim = sims[conv.conversation_id.split(":", 2)[2]]
        reward = (sim.get("reward_info") or {}).get("reward")
        bases.update((sim.get("reward_info") or {}).get("reward_basis") or [])
        reason = str(sim.get("termination_reason") or "")
        cost = sim.get("agent_cost")
        duration = sim.get("duration")
        rollouts.append(
            Rollout(
                task_id=str(sim["task_id"]),
                success=None if reward is None else float(float(reward) >= 1.0),
                error=reason in TAU2_ERRORS,
                truncated=reason in TAU2_TRUNCATED,
                steps=_steps(conv),
                cost_usd=float(cost) if isinstance(cost, int | float) else None,
                latency_s=float(duration) if isinstance(duration, int | float) else None,
                forbidden_tool=_forbidden(engine, conv),
            )
        )
    commit = str(info.get("git_commit") or "")[:12]
    protocol = {
        "model": _canon(agent.get("llm")),
        "sampling": _canon(agent.get("llm_args")),
        "harness": f"tau2-bench {agent.get('implementation')}" + (f" @ {commit}" if commit else ""),
        "tools": _canon(env.get("tool_defs")) or f"tau2 {env.get('domain_name')} domain tools",
        "user": _canon({k: user.get(k) for k in ("implementation", "llm", "llm_args")}),
        "grader": "tau2 reward: " + "+".join(sorted(bases)) if bases else None,
        "judge": None,
        "rule_packs": _packs_version(engine),
        "budgets": _canon({k: info.get(k) for k in ("max_steps", "max_errors") if info.get(k) is not None}),
    }
    return Run(path, "tau2", rollouts, protocol)


# --- Inspect eval logs ------------------------------------------------------------------------------------


def _inspect_conversation(sample: Any, task: str, model: str) -> Conversation | None:
    messages = []
    for m in sample.messages or []:
        out: dict[str, Any] = {"role": m.role, "content": m.text or None}
        if m.role == "assistant" and m.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.function, "arguments": c.arguments or {}}}
                for c in m.tool_calls
            ]
        if m.role == "tool":
            out["tool_call_id"] = m.tool_call_id
            out["is_error"] = m.error is not None
        messages.append(out)
    if not messages:
        return None
    try:
        return Conversation.model_validate(
            {
                "conversation_id": f"inspect:{sample.id}:{sample.epoch}",
                "agent_id": task or "inspect",
                "agent_version": model[:128] or "unknown",
                "task_id": str(sample.id)[:256],
                "messages": messages,
            }
        )
    except ValidationError:
        return None


def _score(sample: Any) -> float | None:
    from inspect_ai.scorer import value_to_float

    if not sample.scores:
        return None
    score = next(iter(sample.scores.values()))
    try:
        return float(value_to_float()(score.value) >= 1.0)
    except (TypeError, ValueError):
        return None


def _inspect(path: Path, engine: RuleEngine) -> Run:
    from inspect_ai.log import read_eval_log

    try:
        log = read_eval_log(str(path))
    except Exception as exc:  # the reader raises many kinds on a broken file; each is bad input here
        raise EvaluationError(f"{path}: not an Inspect eval log: {exc}") from None
    if log.status != "success" and not log.samples:
        raise EvaluationError(f"{path}: the eval log has status {log.status!r} and no samples")
    ev = log.eval
    rollouts = []
    for s in log.samples or []:
        conv = _inspect_conversation(s, ev.task, ev.model)
        usage = [u for u in (s.model_usage or {}).values()]
        costs = [getattr(u, "total_cost", None) for u in usage]
        rollouts.append(
            Rollout(
                task_id=str(s.id),
                success=None if s.error is not None else _score(s),
                error=s.error is not None,
                truncated=s.limit is not None,
                steps=_steps(conv) if conv else None,
                cost_usd=sum(c for c in costs if c is not None) if any(c is not None for c in costs) else None,
                latency_s=s.total_time,
                forbidden_tool=_forbidden(engine, conv) if conv else None,
            )
        )
    scorers = [
        {"name": sc.name, "scorer": sc.scorer, "params": sc.params}
        for sc in ((log.results.scores if log.results else []) or [])
    ]
    config = ev.config.model_dump(exclude_none=True) if ev.config else {}
    budgets = {k: v for k, v in config.items() if k.endswith("_limit")}
    plan = log.plan
    protocol = {
        "model": ev.model,
        "sampling": _canon(
            ev.model_generate_config.model_dump(exclude_none=True) if ev.model_generate_config else None
        ),
        "harness": _canon(
            {
                "task": ev.task,
                "task_version": ev.task_version,
                "solver": ev.solver or None,
                "plan": [st.solver for st in plan.steps] if plan else None,
            }
        ),
        "tools": _canon(sorted({t for st in (plan.steps if plan else []) for t in _tool_names(st.params)})),
        "user": None,
        "grader": _canon(scorers),
        "judge": None,
        "rule_packs": _packs_version(engine),
        "budgets": _canon(budgets),
    }
    return Run(path, "inspect", rollouts, protocol)


def _tool_names(params: Any) -> Iterator[str]:
    tools = params.get("tools") if isinstance(params, dict) else None
    for t in tools if isinstance(tools, list) else []:
        yield str(t.get("name") if isinstance(t, dict) else t)


# --- Vigil's native results --------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Protocol(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    sampling: dict[str, Any] | str | None = None
    harness: str | None = None
    tools: list[str] | str | None = None
    user: str | None = None
    grader: str | None = Field(default=None, description="What decides success (scorer and its version).")
    judge: str | None = Field(default=None, description="Judge name and version, where a judge grades.")
    rule_packs: str | None = Field(default=None, description="Pack versions behind `forbidden_tool`.")
    budgets: dict[str, Any] | str | None = None


class Header(_Strict):
    format: Literal["vigil.results"]
    version: Literal[1]
    protocol: Protocol = Protocol()


class ResultLine(_Strict):
    task_id: str = Field(min_length=1)
    rollout: int = 0
    success: bool | float | None
    error: bool = False
    truncated: bool = False
    steps: float | None = None
    cost_usd: float | None = None
    latency_ms: float | None = None
    forbidden_tool: bool | None = None
    conversation: dict[str, Any] | None = Field(
        default=None, description="The rollout as a Vigil conversation: the gate runs the packs on it."
    )


def _native(path: Path, lines: list[bytes], engine: RuleEngine) -> Run:
    try:
        header = Header.model_validate(orjson.loads(lines[0]))
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise EvaluationError(f"{path}:1: not a {RESULTS_FORMAT} v{RESULTS_VERSION} header: {exc}") from None
    rollouts = []
    measured_here = False
    said: dict[str, set[str]] = {}  # protocol key -> what the rollouts' conversation metadata says
    for n, raw in enumerate(lines[1:], 2):
        try:
            line = ResultLine.model_validate(orjson.loads(raw))
            conv = Conversation.model_validate(line.conversation) if line.conversation else None
        except (orjson.JSONDecodeError, ValidationError) as exc:
            raise EvaluationError(f"{path}:{n}: {exc}") from None
        if conv is not None:
            for key, value in protocol_of(conv.metadata).items():
                said.setdefault(key, set()).add(value or "(not recorded)")
        forbidden = line.forbidden_tool
        if forbidden is None and conv is not None:
            forbidden, measured_here = _forbidden(engine, conv), True
        rollouts.append(
            Rollout(
                line.task_id,
                None if line.success is None else float(float(line.success) >= 1.0),
                line.error,
                line.truncated,
                line.steps if line.steps is not None else (_steps(conv) if conv else None),
                line.cost_usd,
                None if line.latency_ms is None else line.latency_ms / 1000,
                forbidden,
            )
        )
    p = header.protocol
    protocol = {k: _canon(getattr(p, k)) for k in PROTOCOL_KEYS}
    for key, values in said.items():  # the header wins; else the conversations' metadata, where it says
        if protocol.get(key) is None and values != {"(not recorded)"}:
            protocol[key] = "; ".join(sorted(values))
    if measured_here:
        protocol["rule_packs"] = _packs_version(engine)
    return Run(path, RESULTS_FORMAT, rollouts, protocol)


def _nonblank(data: bytes) -> list[bytes]:
    return [ln for ln in data.splitlines() if ln.strip()]


def read_run(path: Path, engine: RuleEngine) -> Run:
    """Read one run's results; the format is told by the file (a bad or unknown file raises EvaluationError)."""
    if not path.is_file():
        raise EvaluationError(f"{path}: no such file")
    if path.suffix == ".eval":
        return _with_rollouts(_inspect(path, engine))
    data = path.read_bytes()
    lines = _nonblank(data)
    if not lines:
        raise EvaluationError(f"{path}: empty file")
    try:
        first = orjson.loads(lines[0])
    except orjson.JSONDecodeError:
        first = None
    if isinstance(first, dict) and first.get("format") == RESULTS_FORMAT:
        return _with_rollouts(_native(path, lines, engine))
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise EvaluationError(f"{path}: neither JSON nor {RESULTS_FORMAT} JSON Lines") from None
    if isinstance(doc, dict) and isinstance(doc.get("simulations"), list):
        return _with_rollouts(_tau2(path, doc, engine))
    if isinstance(doc, dict) and "eval" in doc and "version" in doc:
        return _with_rollouts(_inspect(path, engine))
    raise EvaluationError(
        f"{path}: not a results file the gate reads (Inspect .eval/.json log, τ²-bench results, {RESULTS_FORMAT} JSONL)"
    )


def _with_rollouts(run: Run) -> Run:
    if not run.rollouts:
        raise EvaluationError(f"{run.path}: no results in the file")
    if all(r.success is None for r in run.rollouts):
        # pass@1 needs scores: a run whose grader never scored is not a run to gate (nor a regression)
        raise EvaluationError(
            f"{run.path}: none of its {len(run.rollouts)} rollouts has a success score (all unscored)"
        )
    return run


def tasks(runs: Iterable[Run]) -> set[str]:
    return {r.task_id for run in runs for r in run.rollouts}
