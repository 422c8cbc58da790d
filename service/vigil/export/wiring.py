"""Wires export: ``/v1/exports``, the ``/ui/export`` page; a bad redaction pattern stops start-up."""

from __future__ import annotations

from pathlib import Path

from vigil.export import api, pages
from vigil.export.erase import erase_exports
from vigil.export.redact import Redactor
from vigil.runtime import Runtime

TEMPLATES = Path(__file__).resolve().parent / "templates"


def wire(rt: Runtime) -> None:
    Redactor.of(rt.settings)  # a bad pattern stops start-up, not the first export
    if erase_exports not in rt.hooks.erasers:
        rt.hooks.erasers.append(erase_exports)
    rt.hooks.add_router(api.router)
    rt.hooks.add_router(pages.router)
    rt.hooks.add_page("Export", "/ui/export")
    rt.hooks.add_templates(TEMPLATES)
