"""Wires calibration into a runtime (after the judge stage): API, ``/ui/calibration``, enrichers.

Adds each judge's calibration state and corrected rates to ``GET /v1/judges`` and ``GET /v1/compare``
through their hooks.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from vigil.calibration import api, enrich, pages
from vigil.calibration.overview import Calibration
from vigil.runtime import Runtime

TEMPLATES = Path(__file__).resolve().parent / "templates"


def wire(rt: Runtime) -> Calibration:
    cal = Calibration(
        rt.settings,
        {name: j.version for name, j in rt.judges.items()},
        {name: "offline" if j.offline else "live" for name, j in rt.judges.items()},
        rt.now,
    )
    rt.provide(cal)
    rt.hooks.judge_info_enrichers.append(partial(enrich.judge_infos, cal))
    rt.hooks.compare_enrichers.append(partial(enrich.compare_rows, cal))
    rt.hooks.add_router(api.router)
    rt.hooks.add_router(pages.router)
    rt.hooks.add_page("Calibration", "/ui/calibration")
    rt.hooks.add_templates(TEMPLATES)
    return cal
