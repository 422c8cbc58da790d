"""Tables of the outcomes stage: the join of each outcome to its conversation's agent version."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from ..store.models import Base, utcnow

_ID = BigInteger().with_variant(Integer, "sqlite")


class OutcomeLinkRow(Base):
    """An outcome joined to its (stored) conversation; ``attributed`` says it fell within the window.

    Written when an outcome arrives for a stored conversation, or when the conversation arrives after
    its outcomes; rewritten when a newer revision of the conversation moves its end.
    """

    __tablename__ = "outcome_links"

    outcome_id: Mapped[int] = mapped_column(_ID, primary_key=True)
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
