"""Wires calibration and export into a runtime (listed in ``service.wiring.STAGES``, after the judge stage).

Sets ``rt.extras["calibration"]`` (a :class:`~service.calibration.overview.Calibration`): other stages may
call ``rt.extras["calibration"].judge(session, name)`` for a judge's state and its raw and corrected rates.
Adds the API router, the ``/ui/calibration`` and ``/ui/export`` pages and their navigation entries.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..export.redact import Redactor
from ..runtime import Runtime
from . import enrich
from .overview import Calibration

TEMPLATES = Path(__file__).resolve().parent / "templates"


def wire(rt: Runtime) -> Calibration:
    from . import api, pages

    Redactor(rt.settings.export_redact_patterns)  # a bad pattern stops start-up, not the first export
    stage = rt.extras.get("judge")
    judges = stage.engine.judges if stage is not None else {}
    lanes = stage.engine.lanes if stage is not None else {}
    cal = Calibration(
        rt.settings,
        {name: j.version for name, j in judges.items()},
        {name: "offline" if lane.offline else "live" for name, lane in lanes.items()},
    )
    rt.extras["calibration"] = cal
    rt.extras.setdefault("judge_info_enrichers", []).append(partial(enrich.judge_infos, cal))
    rt.extras.setdefault("compare_enrichers", []).append(partial(enrich.compare_rows, cal))
    rt.extras.setdefault("routers", []).extend([api.router, pages.router])
    nav = rt.extras.setdefault("ui_nav", [])
    for entry in (("Calibration", "/ui/calibration"), ("Export", "/ui/export")):
        if entry not in nav:
            nav.append(entry)
    dirs = rt.extras.setdefault("ui_template_dirs", [])
    if TEMPLATES not in dirs:
        dirs.append(TEMPLATES)
    return cal
