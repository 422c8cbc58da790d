"""The native eval task schema (``vigil.eval_task``, version 2), as a model and as JSON Schema.

Exported lines follow this model; ``vigil export --schema`` prints its JSON Schema. A change of shape
bumps ``schema_version``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vigil.export.tasks import SCHEMA, SCHEMA_VERSION


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskSource(_Strict):
    conversation_id: str
    revision: int
    agent_id: str
    agent_version: str
    task_id: str | None = None


class FiredRule(_Strict):
    rule_id: str
    rule_type: str
    severity: str
    message: str


class JudgeFail(_Strict):
    judge: str
    judge_version: str
    verdict: Literal["fail"]
    categories: list[str] | None = None
    rationale: str | None = None


class Failure(_Strict):
    message_index: int = Field(description="Index of the failing assistant turn in the conversation.")
    failed_turn: dict[str, Any] | None = Field(description="That turn, for reference (what not to do).")
    located_by: str | None = Field(description="Rule marking the failure point; null: the last turn.")
    category: str
    severity: str | None = None
    rules: list[FiredRule]
    judges: list[JudgeFail]


class Review(_Strict):
    notes: list[str]
    expected_behavior: str | None = None


class EvalTask(_Strict):
    """One confirmed failure (or a group of near-duplicates) as an offline eval task."""

    schema_: Literal["vigil.eval_task"] = Field(alias="schema", default=SCHEMA)
    schema_version: Literal[2] = SCHEMA_VERSION
    task_id: str
    group_key: str = Field(description="Same rule, same tool, same user intent: near-duplicates share it.")
    source: TaskSource
    goal: str | None = Field(description="The user's goal where known (e.g. a benchmark's task).")
    intent: str | None = None
    messages: list[dict[str, Any]] = Field(
        description="The conversation up to the failure point (OpenAI chat messages, tool calls, results)."
    )
    failure: Failure
    review: Review
    tools: list[dict[str, Any]] = Field(
        description="The tools the agent had (OpenAI function definitions), offered to the model under test."
    )
    tools_source: Literal["conversation", "calls_seen"] | None = Field(
        description="conversation: its own tool definitions; calls_seen: names and arguments of the calls made."
    )
    grading: list[dict[str, Any]] = Field(
        description='Machine-checkable criteria, e.g. {"type": "must_not_call", "tool": "cancel_order"}, from '
        "findings at or above VIGIL_EXPORT_MIN_CRITERION_SEVERITY, and the reviewer's expected behaviour as a "
        'rubric for a grader model; with neither, a rubric derived from the confirmed failure ("derived": true).',
    )
    duplicates: list[str] = Field(description="Conversation ids of near-duplicates folded into this task.")


def json_schema() -> dict[str, Any]:
    schema = EvalTask.model_json_schema(by_alias=True)
    schema["$id"] = f"https://vigil.dev/schema/eval_task/v{SCHEMA_VERSION}.json"
    return schema
