"""``/ui/dead-letters`` (admin): refused input, counted per reason over the last day, the latest letters with
a preview of what was sent, and a Re-send button (``POST /ui/dead-letters/{id}/replay``, as
``POST /v1/dead-letters/{id}/replay``).

Plain ``def`` handlers: they read the database and re-send through an intake, never on the event loop.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import Response
from sqlalchemy import func, select
from starlette.datastructures import FormData

from vigil.http import runtime_of
from vigil.http.auth import Principal
from vigil.http.dead_letters import refusal_text, replay_letter
from vigil.http.params import MAX_ID
from vigil.store import reads
from vigil.store.db import clock
from vigil.store.models import DeadLetterRow
from vigil.ui.forms import Refused, form_user, go, posted
from vigil.ui.render import render_page, session_slot, ui_user

router = APIRouter(prefix="/ui", include_in_schema=False)

PAGE = "/ui/dead-letters"
PREVIEW_CHARS = 600  # of the raw bytes, as text: enough to tell a producer's payload at a glance


def _refused(request: Request) -> Response:
    return render_page(request, "error.html", 403, title="Admins only", message="dead letters need an admin key")


def per_reason(session: Any) -> list[dict[str, Any]]:
    """Letters of the last day per (reason, source), and how many of them were re-sent: a range of the
    ``created_at`` index, never every row."""
    c = DeadLetterRow.__table__.c
    since = clock(session) - timedelta(days=1)
    rows = session.execute(
        select(c.reason, c.source, func.count(), func.count(c.replayed_at))
        .where(c.created_at >= since)
        .group_by(c.reason, c.source)
        .order_by(func.count().desc(), c.reason)
    ).all()
    return [{"reason": r, "source": s, "letters": n, "replayed": done} for r, s, n, done in rows]


@router.get("/dead-letters")
def dead_letters_page(
    request: Request,
    user: Principal = Depends(ui_user),
    reason: str | None = Query(None, max_length=64),
    done: int | None = Query(None, ge=1, le=MAX_ID),
) -> Response:
    if not user.can("admin"):
        return _refused(request)
    rt = runtime_of(request)
    with rt.sessions() as s:
        counts = per_reason(s)
        letters = reads.list_dead_letters(s, 50, reason or None)
    for d in letters:
        d["raw_preview"] = d["raw_preview"][:PREVIEW_CHARS]
    return render_page(
        request, "dead_letters.html", title="Dead letters", counts=counts, letters=letters, reason=reason, done=done
    )


@router.post("/dead-letters/{letter_id}/replay", dependencies=[Depends(session_slot)])
def replay_page(
    request: Request, letter_id: int = PathParam(ge=1, le=MAX_ID), form: FormData = Depends(posted)
) -> Response:
    try:
        p, _ = form_user(request, form, PAGE)
    except Refused as exc:
        return exc.response
    if not p.can("admin"):
        return _refused(request)
    status, answer = replay_letter(runtime_of(request), letter_id, None, None)
    if status == 200:
        return go(f"{PAGE}?" + urlencode({"done": letter_id}))
    return render_page(
        request,
        "error.html",
        status,
        title=f"Dead letter {letter_id} not re-sent",
        message=refusal_text(answer),
        back=PAGE,
    )
