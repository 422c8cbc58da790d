"""What the review stage's page modules share: the stage of a request, the session's label counter and
queue filter, and the notice a bulk action leaves on the queue page."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from vigil.http import runtime_of
from vigil.review import queue, triage
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


FILTERS = ("agent", "version", "rule", "verdict", "outcome", "reason", "severity", "search")


def queue_filter_of(values: dict[str, str]) -> dict[str, str]:
    """The queue filters among ``values``, each at most an id's length (search: MAX_SEARCH); one holding a
    control character matches nothing and is dropped: none is echoed back whole into a redirect or a cookie
    (a 100 kB field made a 100 kB header)."""
    kept = {k: str(values.get(k) or "").strip()[:256] for k in FILTERS}
    return {k: v for k, v in kept.items() if v and not any(c < " " or c == "\x7f" for c in v)}


def remember_queue_filter(request: Request, response: Response, kept: dict[str, str]) -> Response:
    """Keep the filters claim-next was given in the session, so "Save & next" and "Skip" claim from the
    queue the reviewer filtered, not the whole queue; claiming from an unfiltered queue forgets them."""
    sessions = sessions_of(request)
    data = sessions.read(request)
    if data.get("queue_filter", {}) != kept:
        data["queue_filter"] = kept
        request.state.vigil_session_dirty = True
        sessions.save(request, response)
    return response


def remembered_queue_filter(request: Request) -> dict[str, str]:
    raw = sessions_of(request).read(request).get("queue_filter")
    return queue_filter_of(raw) if isinstance(raw, dict) else {}


def remembered_filter(request: Request) -> queue.QueueFilter:
    return queue.QueueFilter(**remembered_queue_filter(request))  # type: ignore[arg-type]


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
