"""Form posts of the UI: who posts (session and CSRF checked), where to go next, a label carried across log-in.

A form handler is a plain ``def``: FastAPI runs it in a worker thread, so its database work (the session's
row, the queue, the page it renders) never runs on the event loop, where a wait on the database (a row
lock, SQLite's busy timeout) stalled every request of the process, probes and ingest included. Reading
the posted body is the one async step: the :func:`posted` dependency does it on the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from starlette.datastructures import FormData

from vigil.http.auth import Principal
from vigil.ui.render import render_page, sessions_of

STALE_FORM = "This form had expired (the page was open across a log-in or a restart), so nothing was done."
LABEL_FIELDS = ("label", "category", "severity", "notes", "expected_behavior")
COMMENT_FIELDS = ("comment", "comment_on")  # a comment being added, and the message it is on
DRAFT_FIELDS = LABEL_FIELDS + COMMENT_FIELDS


def go(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


# a console page's address with its filters (a conversation's with the escaped list address it came from, at
# most links.BACK_MAX unescaped); longer is not one of ours, and a proxy's header buffer (often 4 kB) would 502
NEXT_MAX = 4096


def safe_next(target: str | None) -> str:
    # only same-site paths: "//host" or "/\\host" would leave the site; a control character (a browser drops a
    # tab or line break from an address: "/\t/host" is "//host" to it) or a Location header of many kilobytes
    # (which a proxy in front answers with a 502) is not a page of ours either
    if (
        target
        and len(target) <= NEXT_MAX
        and target.isprintable()
        and target.startswith("/")
        and not target.startswith(("//", "/\\"))
    ):
        return target
    return "/ui/queue"


class Refused(Exception):
    """A form post the session cannot make: ``response`` says why (log in again, or reload)."""

    def __init__(self, response: Response) -> None:
        self.response = response


async def posted(request: Request) -> FormData:
    """Dependency of form handlers: the posted form, read on the event loop (the handler then runs in a
    worker thread)."""
    return await request.form()


def form_user(request: Request, form: Mapping[str, Any], back: str = "/ui/queue") -> tuple[Principal, dict[str, Any]]:
    """The poster and the form (as a dict); raises Refused (a log-in redirect, or a 403 page) when they
    cannot post. It reads the session's row: call it off the event loop."""
    sessions = sessions_of(request)
    p = sessions.principal(request)
    if p is None:
        raise Refused(go("/ui/login?" + urlencode({"next": safe_next(back), "expired": "1"})))
    if not sessions.csrf_ok(request, str(form.get("csrf", ""))):
        raise Refused(render_page(request, "error.html", 403, title="Form expired", message=STALE_FORM, back=back))
    return p, dict(form)


def draft_of(form: dict[str, Any], prefix: str = "") -> dict[str, str | None] | None:
    """The label (or comment) a form carried (``prefix`` draft_ on the log-in form), or None if it carried
    none."""
    draft = {k: str(form.get(prefix + k) or "") or None for k in DRAFT_FIELDS}
    if not any(draft.values()):
        return None
    return {**draft, "notes": draft["notes"] or "", "expected_behavior": draft["expected_behavior"] or ""}


def label_draft(draft: dict[str, str | None] | None) -> dict[str, str | None] | None:
    """The label part of a draft (None when the draft holds only a comment)."""
    if draft is None or not any(draft.get(k) for k in LABEL_FIELDS):
        return None
    return draft


def comment_draft(draft: dict[str, str | None] | None) -> dict[str, str | None] | None:
    """The comment part of a draft (None when it holds no comment text)."""
    if draft is None or not draft.get("comment"):
        return None
    return {"comment": draft["comment"], "comment_on": draft.get("comment_on")}
