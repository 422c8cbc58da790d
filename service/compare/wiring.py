"""Wires the compare stage: ``GET /v1/compare``, ``GET /v1/quality`` and the compare page's nav entry."""

from __future__ import annotations

from ..runtime import Runtime
from .api import router


def wire(rt: Runtime) -> None:
    rt.extras.setdefault("routers", []).append(router)
