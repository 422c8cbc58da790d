"""Wires the compare stage: ``GET /v1/compare``, ``GET /v1/quality`` and the ``/ui/compare`` page."""

from __future__ import annotations

from ..runtime import Runtime
from .api import router
from .pages import router as pages_router


def wire(rt: Runtime) -> None:
    rt.extras.setdefault("routers", []).append(router)
    if "ui_sessions" in rt.extras:  # the reviewer UI is wired (sessions, layout): add the page to it
        rt.extras["routers"].append(pages_router)
        nav = rt.extras.setdefault("ui_nav", [])
        if ("Compare", "/ui/compare") not in nav:
            nav.append(("Compare", "/ui/compare"))
