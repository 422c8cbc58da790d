"""Request and response models of the review API (they document it in OpenAPI)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vigil.schema import Severity

LabelName = Literal["confirmed_failure", "not_a_failure", "unsure"]
State = Literal["available", "claimed", "done", "waiting"]


class ReasonOut(BaseModel):
    kind: str = Field(description="finding, judge_fail, judge_low_score, outcome, sample or manual")
    key: str = Field(description="Rule id, judge name, outcome type, sample salt or reviewer")
    weight: float
    detail: str
    created_at: datetime | None = None


class LabelOut(BaseModel):
    conversation_id: str
    revision: int | None
    reviewer: str
    label: LabelName
    category: str | None
    severity: str | None
    notes: str
    expected_behavior: str
    propagated_from: str | None = Field(
        default=None, description="Set on a label applied to a near-duplicate cluster: the conversation it copies"
    )
    version: int
    is_current: bool
    created_at: datetime | None


class ItemOut(BaseModel):
    conversation_id: str
    agent_id: str | None
    agent_version: str | None
    priority: float
    state: State
    required_reviews: int
    review_count: int
    sampled: bool
    claimed_by: str | None
    lease_until: datetime | None
    assignee: str | None = Field(default=None, description="The reviewer claim-next sets this item aside for")
    created_at: datetime | None
    updated_at: datetime | None
    reasons: list[ReasonOut] = []
    labels: list[LabelOut] = []
    labels_hidden: bool = Field(
        default=False, description="Other reviewers' labels are left out: a double review blind to you."
    )
    max_severity: str | None = None
    finding_count: int = 0
    message_count: int = 0
    task_id: str | None = None
    received_at: datetime | None = Field(default=None, description="When Vigil stored the conversation")
    flagged_at: datetime | None = Field(default=None, description="When the conversation entered the queue")
    snippet: str = Field(default="", description="The first user message, cut short")


class QueueOut(BaseModel):
    status: str
    counts: dict[str, int] = Field(
        description="Items per state under the filters: available, claimed, open, done, waiting, all"
    )
    capped: list[str] = Field(default_factory=list, description="States with more items than list_count_cap")
    count_text: dict[str, str] = Field(default_factory=dict, description="Counts as shown, e.g. 10,000+")
    reasons: dict[str, int] = Field(description="Open items per reason kind (each counted up to list_count_cap)")
    items: list[ItemOut]
    total: int
    total_capped: bool = False
    limit: int
    offset: int
    next_cursor: str | None = Field(None, description="Pass as cursor for the next page (keyset pagination)")
    sort: str = "priority"
    descending: bool = True


class ClaimFilters(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422, not silently dropped
    agent: str | None = None
    version: str | None = None
    rule: str | None = None
    verdict: Literal["pass", "fail", "unscored"] | None = None
    outcome: str | None = None
    reason: str | None = None
    severity: str | None = None
    q: str | None = Field(default=None, max_length=200, description="Search, as in the queue list")
    release_others: bool = Field(default=True, description="Give back your other unlabelled claims first.")


class ClaimOut(BaseModel):
    conversation_id: str
    lease_until: datetime
    item: ItemOut


class LeaseOut(BaseModel):
    conversation_id: str
    lease_until: datetime


class LabelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422, not silently dropped
    label: LabelName
    category: str | None = Field(default=None, description="From the taxonomy; required for confirmed_failure")
    severity: Severity | None = None
    notes: str = Field(default="", max_length=20_000)
    expected_behavior: str = Field(
        default="", max_length=20_000, description="What the agent should have done (used by eval export)"
    )
    revision: int | None = Field(
        default=None,
        ge=0,
        description="The revision you read; a conversation that has a newer one is refused (409), so a label "
        "never counts for content its reviewer did not see",
    )


class EnqueueIn(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422, not silently dropped
    conversation_id: str = Field(min_length=1, max_length=256)
    note: str = Field(default="", max_length=500)
    weight: float = Field(default=50.0, ge=0, le=1000)


class AuditOut(BaseModel):
    at: datetime | None
    actor: str
    action: str
    conversation_id: str | None
    detail: dict[str, Any]


class HistoryOut(BaseModel):
    conversation_id: str
    labels: list[LabelOut]
    audit: list[AuditOut]


class ClusterOut(BaseModel):
    category: str
    rule_id: str | None
    tool: str | None
    count: int
    total: int
    share: float
    description: str
    rule_description: str
    summary: str = Field(description='e.g. "12 of 19 failures: called cancel_order on a delivered order"')
    examples: list[str]
    also: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Other rules that fired on this cluster's conversations (each conversation is counted "
        "once, in the cluster of its most severe finding)",
    )


class ClustersOut(BaseModel):
    total: int = Field(description="Confirmed failures")
    clusters: list[ClusterOut]
    by_category: list[dict[str, Any]]


class TaxonomyOut(BaseModel):
    labels: list[str]
    rubric: dict[str, str] = Field(default_factory=dict, description="What each label means")
    categories: dict[str, str]
    severities: list[str]
    lease_seconds: int


class ClusterMemberOut(BaseModel):
    conversation_id: str
    priority: float
    agent_version: str | None
    flagged_at: datetime | None
    snippet: str


class OpenClusterOut(BaseModel):
    id: str = Field(description="Stable while the cluster's highest-priority member stays in it")
    reason: dict[str, str] = Field(description="The main reason its members were flagged (kind, key)")
    size: int
    snippet: str = Field(description="First user message of the first member")
    sample: list[str] = Field(description="Members to read before labelling the cluster")
    members: list[ClusterMemberOut]


class OpenClustersOut(BaseModel):
    clusters: list[OpenClusterOut]
    window: int = Field(description="Open items considered (highest priority first)")


class ClusterLabelIn(LabelIn):
    sample: str = Field(min_length=1, max_length=256, description="The conversation the reviewer read and labelled")
    members: list[str] = Field(
        default_factory=list, max_length=500, description="Its near-duplicates that get the same label"
    )


class ClusterLabelOut(BaseModel):
    sample: str
    label: str
    labelled: list[str] = Field(description="The sample, then each member labelled by propagation")
    skipped: list[dict[str, str]] = Field(description="Members left alone, with why (held, done, labelled)")


class BulkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422, not silently dropped
    action: Literal["skip", "assign", "unassign"]
    conversation_ids: list[str] = Field(min_length=1, max_length=500)
    assignee: str | None = Field(default=None, max_length=128, description="For assign: a reviewer's name")


class BulkOut(BaseModel):
    action: str
    done: list[str]
    skipped: list[dict[str, str]] = Field(description="Items left as they were, with why")
    assignee: str | None = None


class CommentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422, not silently dropped
    body: str = Field(min_length=1, max_length=5000)
    message_index: int | None = Field(default=None, ge=0, strict=True, description="Comment on this message (0-based)")


class CommentOut(BaseModel):
    id: int
    conversation_id: str
    message_index: int | None
    author: str
    body: str
    created_at: datetime | None


class PairwiseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422, not silently dropped
    conversation_a: str = Field(min_length=1, max_length=256)
    conversation_b: str = Field(min_length=1, max_length=256)
    choice: Literal["a", "b", "tie"] = Field(description="Which conversation handled the task better")
    notes: str = Field(default="", max_length=5000)


class PairwiseOut(BaseModel):
    id: int
    task_id: str
    conversation_a: str
    conversation_b: str
    version_a: str
    version_b: str
    reviewer: str
    human: str = Field(description="a, b or tie: the `human` field of a calibration pairwise file")
    notes: str
    created_at: datetime | None


class SideOut(BaseModel):
    version: str
    conversation_id: str
    others: list[str] = Field(description="Other runs of the task in this version, most recent first")


class SideBySideOut(BaseModel):
    task_id: str
    versions: list[str] = Field(description="Versions that ran the task, most recent first")
    a: SideOut
    b: SideOut
