"""Calibration and export endpoints.

- ``GET /v1/calibration``: every judge's state and current rates, and agreement between reviewers;
- ``GET /v1/judges/{name}/calibration``: one judge's report, per version;
- ``POST /v1/judges/{name}/calibration``: measure a judge on a labelled set sent in the body;
- ``POST /v1/exports``: export confirmed failures as eval tasks (JSON lines in the response), as a
  ``pending`` run;
- ``POST /v1/exports/{run_id}/ack``: the client has the file: the run's conversations count as exported;
- ``GET /v1/exports``: past export runs, their state and watermarks.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field
from sqlalchemy import select

from ..api.auth import Principal, require
from .errors import CalibrationError, ExportError
from .models import ExportRunRow
from .overview import Calibration, save_run

router = APIRouter(tags=["calibration"])
CONCURRENT = "another export of this format recorded the same conversations first; run it again"


def calibration_of(request: Request) -> Calibration:
    return request.app.state.runtime.extras["calibration"]  # type: ignore[no-any-return]


@router.get("/v1/calibration", dependencies=[require("reviewer")])
def overview(request: Request) -> dict[str, Any]:
    """Every judge: calibrated or not, its current version's agreement and its raw and corrected rates."""
    with request.app.state.runtime.sessions() as s:
        return calibration_of(request).overview(s)


@router.get("/v1/judges/{name}/calibration", dependencies=[require("reviewer")])
def judge_calibration(request: Request, name: str) -> dict[str, Any]:
    """Agreement with reviewers and labelled sets per judge version, state, raw and corrected rates."""
    cal = calibration_of(request)
    with request.app.state.runtime.sessions() as s:
        if name not in cal.judge_names(s):
            raise HTTPException(404, f"no judge {name!r} (defined, with verdicts, or calibrated)")
        return cal.judge(s, name)


class CalibrateBody(BaseModel):
    labels: list[dict[str, Any]] = Field(
        min_length=1,
        max_length=20_000,
        description="Labelled set items (as the lines of a labelled set file).",
    )
    verdicts: list[dict[str, Any]] | None = Field(
        default=None,
        max_length=20_000,
        description="The judge's recorded verdicts; without them the judge is run on the conversations.",
    )
    source: str = Field(default="api", max_length=500, description="Name of the set, kept with the run.")
    save: bool = Field(
        default=True, description="Store the result as the judge version's latest labelled-set run."
    )


@router.post("/v1/judges/{name}/calibration", dependencies=[require("admin")])
async def calibrate_judge(request: Request, name: str, body: CalibrateBody) -> dict[str, Any]:
    """The ``vigil calibrate`` loop over HTTP: a labelled set in, the agreement report out."""
    from .calibrate import calibrate
    from .labelsets import numbered, parse_labels, parse_verdicts

    rt = request.app.state.runtime
    try:
        labels = parse_labels(numbered(body.labels), "labels")
        labels.path = body.source
        verdicts = parse_verdicts(numbered(body.verdicts), "verdicts") if body.verdicts is not None else None
        result = await calibrate(rt, name, labels, verdicts)
    except CalibrationError as exc:
        raise HTTPException(422, str(exc)) from None
    if body.save:
        with rt.sessions.begin() as s:
            result["run_ids"] = save_run(s, name, body.source, result["mode"], result)
    for v in result["versions"]:
        rt.metrics.calibration_runs.labels(v["state"]).inc()
    return result


@router.post("/v1/exports")
def export_tasks(
    request: Request,
    format: Literal["native", "inspect", "verifiers"] = "native",
    since: int | None = Query(None, ge=0, description="Only failures confirmed after this watermark."),
    all_: bool = Query(False, alias="all", description="Also failures exported before."),
    p: Principal = require("admin"),
) -> Response:
    """Confirmed failures as eval tasks, one JSON object per line; headers carry the run and watermark.

    The run is ``pending``: its conversations count as exported (and are left out of the next run) only
    after ``POST /v1/exports/{run_id}/ack``, so a download lost on the way is exported again next time.
    """
    from ..export.redact import Redactor
    from ..export.run import export

    rt = request.app.state.runtime
    try:
        with rt.sessions.begin() as s:
            result = export(
                s,
                {r.id: r for r in rt.rules.rules},
                Redactor(rt.settings.export_redact_patterns),
                format,
                since,
                all_,
                p.name,
                rt.metrics,
                record=False,
            )
    except ExportError as exc:
        raise HTTPException(422, str(exc)) from None
    return Response(
        b"".join(result.lines),
        media_type="application/x-ndjson",
        headers={
            "X-Vigil-Export-Run": str(result.run_id),
            "X-Vigil-Export-State": result.state,
            "X-Vigil-Export-Ack": f"/v1/exports/{result.run_id}/ack",
            "X-Vigil-Watermark": str(result.watermark),
            "X-Vigil-Tasks": str(result.tasks),
            "X-Vigil-Grouped": str(result.grouped),
        },
    )


@router.post("/v1/exports/{run_id}/ack", dependencies=[require("admin")])
def acknowledge_export(request: Request, run_id: int) -> dict[str, Any]:
    """The client has the run's file: its conversations now count as exported (idempotent)."""
    from ..export.run import acknowledge

    with request.app.state.runtime.sessions.begin() as s:
        try:
            return acknowledge(s, run_id)
        except LookupError:
            raise HTTPException(404, f"no export run {run_id}") from None


@router.get("/v1/exports", dependencies=[require("admin")])
def export_runs(request: Request, limit: int = Query(50, ge=1, le=500)) -> list[dict[str, Any]]:
    """Past export runs, newest first: ``pending`` ones are not acknowledged yet."""
    from ..export.run import run_dict

    with request.app.state.runtime.sessions() as s:
        rows = s.scalars(select(ExportRunRow).order_by(ExportRunRow.id.desc()).limit(limit)).all()
        return [run_dict(r) for r in rows]
