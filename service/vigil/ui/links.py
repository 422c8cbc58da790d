"""Links between pages that several stages draw (an alert's conversations, a version's charts)."""

from __future__ import annotations

import re
from urllib.parse import quote, urlencode


def queue_link(agent: str, version: str, signal: str) -> str:
    """The review queue filtered to the conversations behind ``signal`` of this agent version.

    ``signal`` names the series; the queue's own filters narrow to it where one matches
    (``rule:<id>`` → rule, ``outcome:<type>`` → outcome, ``judge:<name>`` → failing verdicts); for
    ``forbidden_tool`` and ``tool_error`` it lists the version's queue (:func:`behind_link` is exact).
    """
    params = {"agent": agent, "version": version, "signal": signal}
    kind, _, name = signal.partition(":")
    if kind == "rule" and name:
        params["rule"] = name
    elif kind == "outcome" and name:
        params["outcome"] = name
    elif kind == "judge":
        params["verdict"] = "fail"
    return "/ui/queue?" + urlencode(params)


def queue_narrows(signal: str) -> bool:
    """Whether :func:`queue_link` lists only the conversations behind ``signal`` (else the version's queue)."""
    kind, _, name = signal.partition(":")
    return (kind in ("rule", "outcome") and bool(name)) or kind == "judge"


def queue_label(signal: str, narrowed: str = "Its conversations in the queue") -> str:
    """The words of a link to :func:`queue_link`: ``narrowed`` where the queue narrows to the signal, and
    what it is otherwise (``forbidden_tool`` and ``tool_error`` have no queue filter: the version's queue)."""
    return narrowed if queue_narrows(signal) else "This version's queue"


def behind_link(agent: str, version: str, signal: str) -> str:
    """Every stored conversation behind ``signal`` of this version, queued or not (the compare stage's list)."""
    return "/ui/compare/conversations?" + urlencode({"agent": agent, "version": version, "signal": signal})


def quality_link(agent: str, version: str, **extra: str) -> str:
    """The charts of one agent version (``extra``: since, until, last)."""
    return "/ui/quality?" + urlencode({"agent": agent, "version": version, **extra})


def compare_link(agent: str, baseline: str, candidate: str) -> str:
    return "/ui/compare?" + urlencode({"agent": agent, "baseline": baseline, "candidate": candidate})


def baseline_version(baseline: str) -> str | None:
    """The version a detection was measured against (``version:v1.4.0`` → ``v1.4.0``; ``self`` → None)."""
    return baseline.split(":", 1)[1] if baseline.startswith("version:") else None


def anchor(signal: str) -> str:
    """The element id of a signal's chart on the quality page (``rule:pii-in-reply`` → ``signal-rule-pii-in-reply``)."""
    return "signal-" + re.sub(r"[^A-Za-z0-9_-]", "-", signal)


# pages a conversation is opened from, by the path its ``from`` parameter starts with: the crumb back
BACK_TO = (("/ui/compare/conversations", "Compare"), ("/ui/conversations", "Conversations"))
BACK_MAX = 2048  # a page's address with its filters; longer is not one of ours


def review_link(cid: str, came_from: str | None = None) -> str:
    """A conversation's page; ``came_from``, the address of the list it is opened from, is its crumb back. An
    address longer than :func:`back_crumb` takes is left out: each of a list's 50 rows carried it, a page
    of 50 times the request's query for a crumb that would be the queue's anyway."""
    back = came_from and len(came_from) <= BACK_MAX
    return "/ui/review/" + quote(cid, safe="") + ("?" + urlencode({"from": came_from}) if back else "")


def back_crumb(came_from: str | None) -> tuple[str, str] | None:
    """(words, address) of the crumb back to the page named by ``from``: one of :data:`BACK_TO`'s, on this
    server; anything else (another host, another page) is None, and the page's crumb is the queue."""
    if not came_from or len(came_from) > BACK_MAX or not came_from.isprintable():
        return None
    path = came_from.split("?", 1)[0]
    return next(((words, came_from) for start, words in BACK_TO if path == start), None)


def back_from(came_from: str | None) -> str | None:
    """``came_from`` where :func:`back_crumb` takes it, else None: what the conversation page's own links,
    forms and redirects carry on, so its crumb survives them and a foreign value is dropped at every step."""
    return came_from if back_crumb(came_from) else None
