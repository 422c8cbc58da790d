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

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from vigil.calibration.errors import CalibrationError
from vigil.calibration.overview import Calibration, save_run
from vigil.http import runtime_of
from vigil.http.auth import require

router = APIRouter(tags=["calibration"])


def calibration_of(request: Request) -> Calibration:
    return runtime_of(request).get(Calibration)


@router.get("/v1/calibration", dependencies=[require("reviewer")])
def overview(request: Request) -> dict[str, Any]:
    """Every judge: calibrated or not, its current version's agreement and its raw and corrected rates."""
    with runtime_of(request).sessions() as s:
        return calibration_of(request).overview(s)


@router.get("/v1/judges/{name}/calibration", dependencies=[require("reviewer")])
def judge_calibration(request: Request, name: str) -> dict[str, Any]:
    """Agreement with reviewers and labelled sets per judge version, state, raw and corrected rates."""
    cal = calibration_of(request)
    with runtime_of(request).sessions() as s:
        if name not in cal.judge_names(s):
            raise HTTPException(404, f"no judge {name!r} (defined, with verdicts, or calibrated)")
        return cal.judge(s, name)


class CalibrateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422, not silently dropped
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
    save: bool = Field(default=True, description="Store the result as the judge version's latest labelled-set run.")


@router.post("/v1/judges/{name}/calibration", dependencies=[require("admin")])
async def calibrate_judge(request: Request, name: str, body: CalibrateBody) -> dict[str, Any]:
    """The ``vigil calibrate`` loop over HTTP: a labelled set in, the agreement report out."""
    from vigil.calibration.calibrate import calibrate
    from vigil.calibration.labelsets import numbered, parse_labels, parse_verdicts

    rt = runtime_of(request)

    def parsed() -> tuple[Any, Any]:  # up to 20,000 items each: CPU work, off the event loop
        labels = parse_labels(numbered(body.labels), "labels")
        labels.path = body.source
        verdicts = parse_verdicts(numbered(body.verdicts), "verdicts") if body.verdicts is not None else None
        return labels, verdicts

    def saved() -> Any:
        with rt.sessions.begin() as s:
            return save_run(s, name, body.source, result["mode"], result)

    try:
        labels, verdicts = await run_in_threadpool(parsed)
        result = await calibrate(rt, name, labels, verdicts)
    except CalibrationError as exc:
        raise HTTPException(422, str(exc)) from None
    if body.save:  # a database that waits must not stall every other request of the process
        result["run_ids"] = await run_in_threadpool(saved)
    for v in result["versions"]:
        rt.metrics.calibration_runs.labels(v["state"]).inc()
    return result
