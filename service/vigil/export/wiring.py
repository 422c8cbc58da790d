"""Wires export: ``/v1/exports``, the ``/ui/export`` page; a bad redaction pattern stops start-up."""

from __future__ import annotations

from pathlib import Path

from vigil.export import api, pages
from vigil.export.redact import Redactor
from vigil.runtime import Runtime

TEMPLATES = Path(__file__).resolve().parent / "templates"


def wire(rt: Runtime) -> None:
    Redactor.of(rt.settings)  # a bad pattern stops start-up, not the first export
    rt.hooks.add_router(api.router)
    rt.hooks.add_router(pages.router)
    rt.hooks.add_page("Export", "/ui/export")
    rt.hooks.add_templates(TEMPLATES)
