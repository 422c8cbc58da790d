"""``/ui/erase/{id}`` (admin): erasing a conversation from the console, as ``DELETE /v1/conversations/{id}`` does.

The conversation page links here; this page says what goes and what stays and asks to confirm; the form
(with the session's CSRF token) erases and shows the rows removed per table. Plain ``def`` handlers: they
write the database, never on the event loop.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy import exists, select
from starlette.datastructures import FormData

from vigil.http import runtime_of
from vigil.http.auth import Principal
from vigil.store.erasure import erase_each
from vigil.store.models import ConversationRow
from vigil.ui.forms import Refused, form_user, posted
from vigil.ui.render import render_page, session_slot, ui_user

router = APIRouter(prefix="/ui", include_in_schema=False)


def _refused(request: Request) -> Response:
    return render_page(request, "error.html", 403, title="Admins only", message="erasing needs an admin key")


@router.get("/erase/{conversation_id:path}")
def erase_page(request: Request, conversation_id: str, user: Principal = Depends(ui_user)) -> Response:
    if not user.can("admin"):
        return _refused(request)
    with runtime_of(request).sessions() as s:
        stored = bool(s.scalar(select(exists().where(ConversationRow.conversation_id == conversation_id))))
    return render_page(
        request, "erase.html", title=f"Erase {conversation_id}", cid=conversation_id, stored=stored, result=None
    )


@router.post("/erase/{conversation_id:path}", dependencies=[Depends(session_slot)])
def erase_now(request: Request, conversation_id: str, form: FormData = Depends(posted)) -> Response:
    back = "/ui/erase/" + quote(conversation_id, safe="")
    try:
        p, fields = form_user(request, form, back)
    except Refused as exc:
        return exc.response
    if not p.can("admin"):
        return _refused(request)
    rt = runtime_of(request)
    tombstone = fields.get("tombstone") == "1"
    (result,) = erase_each(rt.sessions, [conversation_id], rt.hooks.erasers, p.name, tombstone)
    if result["status"] == "not_found":
        message = f"Nothing of conversation {conversation_id} is stored."
        return render_page(request, "error.html", 404, title="Not found", message=message)
    return render_page(request, "erase.html", title=f"Erased {conversation_id}", cid=conversation_id, result=result)
