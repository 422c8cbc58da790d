"""The console's own pages, which read every stage: the home page (``/ui``), quality charts (``/ui/quality``),
finding conversations (``/ui/conversations``), refused input (``/ui/dead-letters``, admin) and erasing a
conversation (``/ui/erase/{id}``, admin).

They live in the app layer because they join what several stages own (detections, traffic, the review
queue, judge spend, calibration); each stage's own pages stay in its package.
"""

from __future__ import annotations

from pathlib import Path

from vigil.runtime import Runtime

TEMPLATES = Path(__file__).resolve().parent / "templates"


def wire(rt: Runtime) -> None:
    """Add the home and quality pages (and ``/`` → ``/ui``) to ``rt``'s routers and navigation."""
    from vigil.app.home.dead_letters import router as dead_letters
    from vigil.app.home.erase import router as erase
    from vigil.app.home.pages import api, root, router

    rt.hooks.add_router(root)
    rt.hooks.add_router(router)
    rt.hooks.add_router(dead_letters)
    rt.hooks.add_router(erase)
    rt.hooks.add_router(api)
    rt.hooks.add_templates(TEMPLATES)
    rt.hooks.nav[:0] = [e for e in [("Home", "/ui")] if e not in rt.hooks.nav]
    rt.hooks.add_page("Quality", "/ui/quality")
    rt.hooks.add_page("Conversations", "/ui/conversations")
