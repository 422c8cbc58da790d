"""The record: every table more than one stage reads.

Conversations, findings, outcomes and dead letters (written by ingest and the outcome join), judge
verdicts and pairwise comparisons (written by the judge), reviewers' queue items and labels (written by
review), and outcomes joined to their versions. A stage's own working tables (queues, leases, state)
stay beside its code, on the same :class:`Base`. Keep these columns stable: other stages read them.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from vigil.store.db import db_now, json_text, utcnow

JsonType = JSON().with_variant(JSONB(), "postgresql")


class JsonText(TypeDecorator[Any]):
    """JSON kept as text on every database: for values written hot and read back whole, never queried inside.
    Postgres stores the text as it comes (lz4 where it has it, migration ``0011_otlp_text``) instead of
    parsing it into ``jsonb``; OTLP spans stored as ``jsonb`` cost the database four times what native
    ingest of the same conversations costs it (``bench.bench_otlp_server --db postgres``)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else json_text(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else orjson.loads(value)


ID = BigInteger().with_variant(Integer, "sqlite")  # SQLite autoincrements only INTEGER PRIMARY KEY


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JsonType, list[Any]: JsonType, datetime: DateTime(timezone=True)}

    if TYPE_CHECKING:
        # every model declares __tablename__, so it maps to a Table (SQLAlchemy allows any FromClause)
        __table__: ClassVar[Table]


class ConversationRow(Base):
    __tablename__ = "conversations"

    conversation_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    revision: Mapped[int] = mapped_column(BigInteger)
    schema_version: Mapped[int] = mapped_column(Integer, default=1)
    agent_id: Mapped[str] = mapped_column(String(256))
    agent_version: Mapped[str] = mapped_column(String(128))
    task_id: Mapped[str | None] = mapped_column(String(256))
    intent: Mapped[str | None] = mapped_column(String(256))
    status: Mapped[str | None] = mapped_column(String(16))
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    received_at: Mapped[datetime] = mapped_column(default=db_now())
    message_count: Mapped[int] = mapped_column(Integer)
    tool_call_count: Mapped[int] = mapped_column(Integer)
    tool_error_count: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int | None] = mapped_column(BigInteger)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    finding_count: Mapped[int] = mapped_column(Integer, default=0)
    max_severity: Mapped[str | None] = mapped_column(String(16))
    document: Mapped[str] = mapped_column(Text)

    __table_args__ = (
        Index("ix_conversations_agent", "agent_id", "agent_version", "received_at"),
        Index("ix_conversations_received", "received_at"),
        Index("ix_conversations_task", "task_id"),
        # the few conversations a severity=high or critical list reads (partial: the writer pays on them alone)
        Index(
            "ix_conversations_severe",
            "max_severity",
            "received_at",
            postgresql_where=text("max_severity IN ('high', 'critical')"),
            sqlite_where=text("max_severity IN ('high', 'critical')"),
        ),
    )


class FindingRow(Base):
    __tablename__ = "findings"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(String(256), index=True)
    revision: Mapped[int] = mapped_column(BigInteger)
    agent_id: Mapped[str] = mapped_column(String(256))
    agent_version: Mapped[str] = mapped_column(String(128))
    rule_id: Mapped[str] = mapped_column(String(64))
    rule_type: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    evidence: Mapped[list[Any]]
    details: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_findings_rule", "rule_id", "agent_id", "agent_version"),
        # append-only: a BRIN index costs the writer next to nothing and serves retention's time range
        Index("ix_findings_created", "created_at", postgresql_using="brin"),
    )


class OutcomeRow(Base):
    __tablename__ = "outcomes"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    idempotency_key: Mapped[str] = mapped_column(String(512), unique=True)
    conversation_id: Mapped[str] = mapped_column(String(256), index=True)
    type: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float, default=1.0)
    occurred_at: Mapped[datetime]
    received_at: Mapped[datetime] = mapped_column(default=db_now())
    source: Mapped[str] = mapped_column(String(32), default="api")

    # retention walks the outcomes that passed its cutoff since its last run, in (received_at, id) order
    __table_args__ = (Index("ix_outcomes_received", "received_at", "id"),)


class DeadLetterRow(Base):
    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(32))
    topic: Mapped[str | None] = mapped_column(String(256))
    partition: Mapped[int | None] = mapped_column(Integer)
    offset: Mapped[int | None] = mapped_column(BigInteger)
    # the last offset of the batch's bad messages the row holds: every message from ``offset`` to it was
    # read and stored in one batch, so a bad one among them is recorded (here or in its reason's row)
    last_offset: Mapped[int | None] = mapped_column(BigInteger)
    key: Mapped[str | None] = mapped_column(String(512))
    reason: Mapped[str] = mapped_column(String(64))
    detail: Mapped[str] = mapped_column(Text)
    raw: Mapped[bytes] = mapped_column(LargeBinary)
    raw_size: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # when ``POST /v1/dead-letters/{id}/replay`` last fed ``raw`` back through its intake and it was taken
    replayed_at: Mapped[datetime | None] = mapped_column(default=None)
    # the query parameters the intake read of the request ``raw`` is the body of (``format=openai&agent_id=...``),
    # URL-encoded: a replay reads ``raw`` with them (None: none were read)
    query: Mapped[str | None] = mapped_column(Text, default=None)

    __table_args__ = (
        UniqueConstraint("source", "topic", "partition", "offset", name="uq_dead_letters_position"),
        Index("ix_dead_letters_created", "created_at", postgresql_using="brin"),
        # the newest letters of one reason (the console's per-reason link, `dead-letters replay --all --reason`):
        # a range of this index, not a walk back through every newer letter of other reasons
        Index("ix_dead_letters_reason", "reason", "id"),
    )


# The record other stages read: judge verdicts, reviewers' labels, outcomes joined to their versions.


class VerdictRow(Base):
    __tablename__ = "verdicts"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    request_id: Mapped[int | None] = mapped_column(ID, unique=True)
    judge: Mapped[str] = mapped_column(String(64))
    judge_version: Mapped[str] = mapped_column(String(64))
    conversation_id: Mapped[str] = mapped_column(String(256), index=True)
    revision: Mapped[int] = mapped_column(BigInteger)
    agent_id: Mapped[str] = mapped_column(String(256))
    agent_version: Mapped[str] = mapped_column(String(128))
    verdict: Mapped[str] = mapped_column(String(16))  # pass | fail | unscored
    score: Mapped[float | None] = mapped_column(Float)
    categories: Mapped[list[Any]]
    rationale: Mapped[str | None] = mapped_column(Text)
    unscored_reason: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(256))
    offline: Mapped[bool] = mapped_column(Boolean, default=False)
    prompt_hash: Mapped[str] = mapped_column(String(64))
    raw_reply: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    reason: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_verdicts_judge_agent", "judge", "agent_id", "agent_version", "created_at"),
        Index("ix_verdicts_created", "created_at"),  # rollup job and retention read verdicts by time
        # compare's protocol reads a version's newest verdicts (which judge versions and models scored it)
        Index("ix_verdicts_version", "agent_id", "agent_version", "created_at"),
    )


class PairwiseRow(Base):
    """One pairwise comparison, asked in both orders. ``position_bias`` is set when the orders disagree."""

    __tablename__ = "pairwise_comparisons"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    judge: Mapped[str] = mapped_column(String(64))
    judge_version: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(256))
    offline: Mapped[bool] = mapped_column(Boolean, default=False)
    prompt_hash: Mapped[str] = mapped_column(String(64))
    input_hash: Mapped[str] = mapped_column(String(64))
    label_a: Mapped[str | None] = mapped_column(String(256))
    label_b: Mapped[str | None] = mapped_column(String(256))
    winner: Mapped[str | None] = mapped_column(String(8))  # a | b | tie; null when biased or unscored
    position_bias: Mapped[bool] = mapped_column(Boolean, default=False)
    first_choice: Mapped[str | None] = mapped_column(String(8))  # choice when A is shown first (a|b|tie)
    second_choice: Mapped[str | None] = mapped_column(String(8))  # choice when B is shown first, mapped back
    unscored_reason: Mapped[str | None] = mapped_column(String(64))
    rationales: Mapped[list[Any]]
    raw_replies: Mapped[list[Any]]
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_pairwise_judge_created", "judge", "created_at"),)


class ReviewItemRow(Base):
    """One conversation in the queue (a conversation enters once)."""

    __tablename__ = "review_items"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(String(256), unique=True)
    # null until the conversation itself is stored (an outcome may arrive first); such items wait
    agent_id: Mapped[str | None] = mapped_column(String(256))
    agent_version: Mapped[str | None] = mapped_column(String(128))
    priority: Mapped[float] = mapped_column(Float, default=0.0)
    status: Mapped[str] = mapped_column(String(16), default="open")  # open | done
    required_reviews: Mapped[int] = mapped_column(Integer, default=1)
    review_count: Mapped[int] = mapped_column(Integer, default=0)
    sampled: Mapped[bool] = mapped_column(Boolean, default=False)
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claimed_at: Mapped[datetime | None]
    lease_until: Mapped[datetime | None]
    # a reviewer this item is set aside for: claim-next offers it to them first and to nobody else
    assignee: Mapped[str | None] = mapped_column(String(128), index=True, default=None)
    assigned_at: Mapped[datetime | None] = mapped_column(default=None)  # when ``assignee`` was set
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_review_items_claimable", "status", "priority", "created_at"),
        Index("ix_review_items_done", "status", "updated_at"),
        Index("ix_review_items_claimed", "claimed_by"),  # a reviewer's held items (claim-next)
        # the flagger fills in items that waited for their conversation: a small partial index
        Index(
            "ix_review_items_waiting",
            "conversation_id",
            postgresql_where=text("agent_id IS NULL"),
            sqlite_where=text("agent_id IS NULL"),
        ),
        # the console counts a window's flagged conversations per version from this index alone
        Index("ix_review_items_created", "created_at", "agent_id", "agent_version"),
        # calibration on randomly sampled items only: a small partial index instead of a scan of the queue
        Index(
            "ix_review_items_sampled",
            "conversation_id",
            postgresql_where=text("sampled IS TRUE"),
            sqlite_where=text("sampled = 1"),
        ),
    )


class ReviewLabelRow(Base):
    """A reviewer's label on a conversation. Changing a label adds a version; older versions stay."""

    __tablename__ = "review_labels"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(String(256), index=True)
    revision: Mapped[int | None] = mapped_column(BigInteger)  # conversation revision the reviewer saw
    reviewer: Mapped[str] = mapped_column(String(128))
    label: Mapped[str] = mapped_column(String(32))  # confirmed_failure | not_a_failure | unsure
    category: Mapped[str | None] = mapped_column(String(64))
    severity: Mapped[str | None] = mapped_column(String(16))
    notes: Mapped[str] = mapped_column(Text, default="")
    expected_behavior: Mapped[str] = mapped_column(Text, default="")
    # set when the reviewer labelled a cluster at once: the conversation whose label this one copies
    propagated_from: Mapped[str | None] = mapped_column(String(256), default=None)
    version: Mapped[int] = mapped_column(Integer)
    is_current: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("conversation_id", "reviewer", "version", name="uq_review_labels_version"),
        Index("ix_review_labels_current", "is_current", "label", "created_at"),
        Index("ix_review_labels_reviewer", "reviewer", "created_at"),
    )


class OutcomeLinkRow(Base):
    """An outcome joined to its (stored) conversation; ``attributed`` says it fell within the window.

    Written when an outcome arrives for a stored conversation, or when the conversation arrives after
    its outcomes; rewritten when a newer revision of the conversation moves its end.
    """

    __tablename__ = "outcome_links"

    outcome_id: Mapped[int] = mapped_column(ID, primary_key=True)
    conversation_id: Mapped[str] = mapped_column(String(256), index=True)
    agent_id: Mapped[str] = mapped_column(String(256))
    agent_version: Mapped[str] = mapped_column(String(128))
    type: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    happened: Mapped[bool] = mapped_column(Boolean)
    attributed: Mapped[bool] = mapped_column(Boolean)
    conversation_received_at: Mapped[datetime]
    linked_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_outcome_links_version", "agent_id", "agent_version", "type"),
        Index("ix_outcome_links_linked", "linked_at"),
    )
