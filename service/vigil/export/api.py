"""Export endpoints.

- ``POST /v1/exports``: export confirmed failures as eval tasks (JSON lines in the response), as a
  ``pending`` run;
- ``POST /v1/exports/{run_id}/ack``: the client has the file: the run's conversations count as exported;
- ``GET /v1/exports``: past export runs, their state and watermarks.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import Response
from sqlalchemy import select

from vigil.export.errors import ExportError
from vigil.export.models import ExportRunRow
from vigil.http import runtime_of
from vigil.http.auth import Principal, require
from vigil.http.params import MAX_ID

router = APIRouter(tags=["export"])


CONCURRENT = "another export of this format recorded the same conversations first; run it again"


@router.post("/v1/exports")
def export_tasks(
    request: Request,
    format: Literal["native", "inspect", "verifiers"] = "native",
    since: int | None = Query(None, ge=0, le=MAX_ID, description="Only failures confirmed after this watermark."),
    all_: bool = Query(False, alias="all", description="Also failures exported before."),
    p: Principal = require("admin"),
) -> Response:
    """Confirmed failures as eval tasks, one JSON object per line; headers carry the run and watermark.

    The run is ``pending``: its conversations count as exported (and are left out of the next run) only
    after ``POST /v1/exports/{run_id}/ack``, so a download lost on the way is exported again next time.
    """
    from vigil.export.redact import Redactor
    from vigil.export.run import export

    if request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers:
        # options sent as a JSON body were ignored: {"format": "inspect"} exported native tasks
        raise HTTPException(
            422,
            "POST /v1/exports takes its options as query parameters (?format=inspect&since=N&all=true), "
            "not a body: nothing was exported",
        )
    rt = runtime_of(request)
    try:
        with rt.sessions.begin() as s:
            result = export(
                s,
                {r.id: r for r in rt.rules.rules},
                Redactor.of(rt.settings),
                format,
                since,
                all_,
                p.name,
                rt.metrics,
                record=False,
                min_severity=rt.settings.export_min_criterion_severity,
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
            "X-Vigil-Skipped": str(len(result.skipped)),  # which and why: `vigil export` lists them
            "X-Vigil-Grouped": str(result.grouped),
            # tasks a harness fails without a grader model; tasks with a rubric, which a grader model decides
            "X-Vigil-Checkable": str(result.checkable),
            "X-Vigil-Model-Graded": str(result.model_graded),
        },
    )


@router.post("/v1/exports/{run_id}/ack", dependencies=[require("admin")])
def acknowledge_export(request: Request, run_id: int = PathParam(ge=1, le=MAX_ID)) -> dict[str, Any]:
    """The client has the run's file: its conversations now count as exported (idempotent)."""
    from vigil.export.run import acknowledge

    with runtime_of(request).sessions.begin() as s:
        try:
            return acknowledge(s, run_id)
        except LookupError:
            raise HTTPException(404, f"no export run {run_id}") from None


@router.get("/v1/exports", dependencies=[require("reviewer")])
def export_runs(request: Request, limit: int = Query(50, ge=1, le=500)) -> list[dict[str, Any]]:
    """Past export runs, newest first: ``pending`` ones are not acknowledged yet. Reviewers may list them,
    as ``/ui/export`` shows them (who exported what, when); running and acknowledging one is the admin's."""
    from vigil.export.run import run_dict

    with runtime_of(request).sessions() as s:
        rows = s.scalars(select(ExportRunRow).order_by(ExportRunRow.id.desc()).limit(limit)).all()
        return [run_dict(r) for r in rows]
