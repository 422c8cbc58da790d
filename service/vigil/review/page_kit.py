"""What the review stage's page modules share: the stage of a request, the session's label counter, and
the notice a bulk action leaves on the queue page."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from vigil.http import runtime_of
from vigil.review import triage
from vigil.review.stage import ReviewStage
from vigil.ui.render import sessions_of


def stage_of(request: Request) -> ReviewStage:
    return runtime_of(request).get(ReviewStage)


def reviewer_names(request: Request) -> list[str]:
    """Names of the keys that may review (the people items can be assigned to)."""
    return triage.reviewer_names(request.app.state.keyring.keys)


def labelled_this_session(request: Request) -> int:
    return int(sessions_of(request).read(request).get("labelled") or 0)


def count_labels(request: Request, response: Response, n: int = 1) -> Response:
    """Add ``n`` to the session's label counter (kept in the signed session cookie)."""
    sessions = sessions_of(request)
    sessions.read(request)["labelled"] = labelled_this_session(request) + n
    request.state.vigil_session_dirty = True
    sessions.save(request, response)
    return response


def notice_count(request: Request, name: str) -> int:
    """A count a redirect put in the URL for its notice (``?done=3``); anything else (text, a sign, more
    digits than any batch holds) reads as 0: the notice is the page's, never a reason for it to fail."""
    return form_int(request.query_params.get(name) or "", 9) or 0


def form_int(value: str, digits: int = 18) -> int | None:
    """A whole number a form or an address sent (a revision, a message index, a count): ASCII digits only,
    at most ``digits`` of them, else None. ``int`` also reads other scripts' digits ("١"), signs, spaces and
    underscores ("1_0"), and ``isdigit`` passes "²", which ``int`` refuses: no page of Vigil's sends those."""
    return int(value) if value.isascii() and value.isdigit() and len(value) <= digits else None


def bulk_notice(request: Request) -> str | None:
    q = request.query_params
    action = q.get("bulk")
    if action not in triage.BULK_ACTIONS:
        return None
    done, left = notice_count(request, "done"), notice_count(request, "left")
    to = q.get("to")
    verb = {"skip": "Skipped", "assign": "Assigned", "unassign": "Unassigned"}[action]
    if action == "assign" and to in reviewer_names(request):
        verb = f"Assigned to {to}:"
    if done == 0:
        text = "Nothing changed: tick some items" + (" and pick a reviewer." if action == "assign" else ".")
    else:
        text = f"{verb} {done} item{'s' if done != 1 else ''}."
    if left and done:
        text += f" {left} left as they were (held by someone else, done, or not in the queue)."
    return text
