"""Finding stored conversations: by id, or newest first by agent, version, rule, severity and time.

``/ui/conversations`` and ``vigil conversations list|show`` read what ``GET /v1/conversations`` and
``GET /v1/conversations/{id}`` read (:func:`vigil.store.reads.list_conversations`): keyset pages, counts
capped at ``list_count_cap``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from vigil.app.home.quality import RangeError, parse_time
from vigil.rules import SEVERITY_RANK
from vigil.store import reads
from vigil.store.models import ConversationRow

PAGE = 50


class FindError(ValueError):
    """A filter the list cannot apply (an unreadable time, an unknown severity, a damaged cursor)."""


@dataclass
class Filters:
    agent: str | None = None
    version: str | None = None
    rule: str | None = None
    severity: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    given: dict[str, str] = field(default_factory=dict)  # the non-empty parameters as given, for links

    @classmethod
    def read(
        cls,
        agent: str | None = None,
        version: str | None = None,
        rule: str | None = None,
        severity: str | None = None,
        since: str | None = None,
        until: str | None = None,
    ) -> Filters:
        """Filters from a page's or a command's text; empty values filter nothing."""
        given = {
            k: v.strip()
            for k, v in {
                "agent": agent,
                "version": version,
                "rule": rule,
                "severity": severity,
                "since": since,
                "until": until,
            }.items()
            if v and v.strip()
        }
        sev = given.get("severity")
        if sev is not None:
            if sev.lower() not in SEVERITY_RANK:
                raise FindError(f"severity must be one of {', '.join(SEVERITY_RANK)}, not {sev!r}")
            sev = given["severity"] = sev.lower()  # any case, as the review queue and the API take it
        try:
            start, end = parse_time(given.get("since"), "since"), parse_time(given.get("until"), "until")
        except RangeError as exc:
            raise FindError(str(exc)) from None
        if start is not None and end is not None and start >= end:
            raise FindError(f"since ({start:%Y-%m-%d %H:%M}) must be before until ({end:%Y-%m-%d %H:%M})")
        return cls(given.get("agent"), given.get("version"), given.get("rule"), sev, start, end, given)

    def as_query(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "version": self.version,
            "rule": self.rule,
            "min_severity": self.severity,
            "since": self.since,
            "until": self.until,
        }


def exists(session: Session, conversation_id: str) -> bool:
    return session.get(ConversationRow, conversation_id) is not None


def page(session: Session, filters: Filters, cursor: str | None, count_cap: int, limit: int = PAGE) -> dict[str, Any]:
    """One page of conversations matching ``filters``, newest first, after ``cursor``."""
    try:
        return reads.list_conversations(session, limit, 0, cursor or None, count_cap, **filters.as_query())
    except reads.BadCursor as exc:
        raise FindError(str(exc)) from None
