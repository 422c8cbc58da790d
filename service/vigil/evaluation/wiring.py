"""Plugs the evaluation stage into a process: ``GET /v1/rules/quality``."""

from __future__ import annotations

from vigil.runtime import Runtime


def wire(rt: Runtime) -> None:
    from vigil.evaluation.api import router

    rt.hooks.add_router(router)
