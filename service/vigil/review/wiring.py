"""Wires the review stage into a runtime: flagger, listeners, API, reviewer UI pages, metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from vigil.review import api, insights, pages, triage_pages
from vigil.review.models import ReviewAuditRow, ReviewCommentRow, ReviewPairwiseRow, ReviewReasonRow, ReviewSkipRow
from vigil.review.stage import ReviewStage
from vigil.runtime import Runtime
from vigil.store.erasure import deleting

# the review stage's own rows naming a conversation (its items and labels are the shared record's)
ERASE = deleting(
    ReviewReasonRow.conversation_id,
    ReviewSkipRow.conversation_id,
    ReviewAuditRow.conversation_id,
    ReviewCommentRow.conversation_id,
    ReviewPairwiseRow.conversation_a,
    ReviewPairwiseRow.conversation_b,
)

TEMPLATES = Path(__file__).resolve().parent / "templates"
OWN_NAV = [("Queue", "/ui/queue"), ("Progress", "/ui/progress"), ("Clusters", "/ui/clusters")]


def _enrich(session: Session, conversation: dict[str, Any]) -> None:
    item = insights.item_detail(session, conversation["conversation_id"])
    # this view does not know its caller: labels of a still-blind double review are left out for everyone
    conversation["review"] = insights.blind_view(item, None) if item is not None else None


def wire(rt: Runtime) -> ReviewStage:
    stage = ReviewStage.from_runtime(rt)
    rt.provide(stage)
    rt.hooks.downstream.append(stage.flagger)
    rt.hooks.verdict_listeners.append(stage.flagger.on_verdicts)
    rt.hooks.outcome_listeners.append(stage.flagger.on_outcomes)
    rt.hooks.conversation_enrichers.append(_enrich)
    if ERASE not in rt.hooks.erasers:
        rt.hooks.erasers.append(ERASE)
    rt.hooks.login_resumers.append(pages.resume_after_login)
    rt.hooks.add_router(api.router)
    rt.hooks.add_router(pages.router)
    rt.hooks.add_router(triage_pages.router)
    rt.hooks.nav[:0] = [entry for entry in OWN_NAV if entry not in rt.hooks.nav]
    rt.hooks.add_templates(TEMPLATES)
    rt.metrics.review_queue_open_items.set_function(stage.open_items)
    return stage
