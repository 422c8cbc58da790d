"""Wires the review stage into a runtime: flagger, listeners, API, reviewer UI, metrics.

Other stages rely on:

- ``rt.extras["review"]``: the :class:`~service.review.stage.ReviewStage` (policy, flagger);
- ``rt.extras["ui_nav"]``: ``(label, path)`` entries of the UI's top navigation; append yours;
- ``rt.extras["ui_template_dirs"]``: folders searched after the UI's own templates (``base.html``);
- ``rt.extras["ui_sessions"]``: the cookie :class:`~service.web.session.SessionManager`.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from sqlalchemy.orm import Session

from ..runtime import Runtime
from ..web import pages
from ..web.session import SessionManager
from . import api, insights
from .stage import ReviewStage

log = logging.getLogger(__name__)

OWN_NAV = [("Queue", "/ui/queue"), ("Progress", "/ui/progress"), ("Clusters", "/ui/clusters")]


def _enrich(session: Session, conversation: dict[str, Any]) -> None:
    item = insights.item_detail(session, conversation["conversation_id"])
    # this view does not know its caller: labels of a still-blind double review are left out for everyone
    conversation["review"] = insights.blind_view(item, None) if item is not None else None


def wire(rt: Runtime) -> None:
    stage = ReviewStage.from_runtime(rt)
    rt.extras["review"] = stage
    rt.pipeline.downstream.append(stage.flagger)
    rt.extras["verdict_listeners"].append(stage.flagger.on_verdicts)
    rt.extras["outcome_listeners"].append(stage.flagger.on_outcomes)
    rt.extras["conversation_enrichers"].append(_enrich)
    s = rt.settings
    secret = s.review_session_secret.get_secret_value()
    if not secret:
        secret = secrets.token_urlsafe(32)
        if "serve" in rt.extras.get("roles", ()) or "api" in rt.extras.get("roles", ()):
            log.info("VIGIL_REVIEW_SESSION_SECRET is not set: UI sessions last only as long as this process")
    rt.extras["ui_sessions"] = SessionManager(
        secret, s.review_session_max_age_seconds, s.review_cookie_secure
    )
    rt.extras["routers"].extend([api.router, pages.router])
    nav = rt.extras.setdefault("ui_nav", [])
    nav[:0] = [entry for entry in OWN_NAV if entry not in nav]
    rt.extras.setdefault("ui_template_dirs", [])
    rt.metrics.review_queue_open_items.set_function(stage.open_items)
