"""Wires the compare stage: ``GET /v1/compare``, ``GET /v1/quality`` and the ``/ui/compare`` page."""

from __future__ import annotations

from pathlib import Path

from vigil.compare.api import router
from vigil.compare.pages import router as pages_router
from vigil.runtime import Runtime

TEMPLATES = Path(__file__).resolve().parent / "templates"


def wire(rt: Runtime) -> None:
    rt.hooks.add_router(router)
    rt.hooks.add_router(pages_router)
    rt.hooks.add_templates(TEMPLATES)
    rt.hooks.add_page("Compare", "/ui/compare")
