"""UI page ``/ui/export``: download confirmed failures as eval tasks, mark a download as saved.

A download from ``/ui/export`` is a pending run: the browser may not have saved it, so its conversations
count as exported only when the admin marks the run as saved (``POST /ui/export/{run_id}/ack``).

Both forms are plain ``def`` handlers (FastAPI runs them in a worker thread): an export reads every
confirmed failure, and neither it nor a row lock held on a run may stall the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select
from starlette.datastructures import FormData

from vigil.export.errors import ExportError
from vigil.export.models import ExportRunRow
from vigil.http import runtime_of
from vigil.http.auth import Principal
from vigil.http.params import MAX_ID
from vigil.ui.forms import posted
from vigil.ui.render import render_page, session_slot, sessions_of, ui_user

router = APIRouter(prefix="/ui", include_in_schema=False)


def _admin(request: Request, form: Mapping[str, Any], back: str) -> Principal:
    """The admin posting ``form`` (the session's row is read: off the event loop), or an HTTP refusal."""
    sessions = sessions_of(request)
    p = sessions.principal(request)
    if p is None:
        raise HTTPException(303, "log in first", headers={"Location": f"/ui/login?next={back}"})
    if not sessions.csrf_ok(request, str(form.get("csrf", ""))):
        raise HTTPException(403, "missing or stale form token: reload the page and try again")
    if not p.can("admin"):
        raise HTTPException(403, "exporting needs an admin key")
    return p


def _watermark(raw: str) -> int | None:
    """The form's "since": empty, or a label id the database can compare (a 64-bit integer)."""
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_ID:
        raise ExportError(f"since must be a label id from 0 to {MAX_ID} (a run's watermark), not {raw[:40]!r}")
    return int(raw)


# Set on a download's answer: the page's script waits for it, then shows the run the download made (a form
# post that answers with a file leaves the page as it was). It holds only the run's id.
DOWNLOADED = "vigil_export_run"


@router.get("/export")
def export_page(
    request: Request,
    user: Principal = Depends(ui_user),
    error: str | None = None,
    run: int | None = Query(None, ge=1, le=MAX_ID),
) -> Response:
    rt = runtime_of(request)
    with rt.sessions() as s:
        runs = s.scalars(select(ExportRunRow).order_by(ExportRunRow.id.desc()).limit(50)).all()
        downloaded = s.get(ExportRunRow, run) if run is not None else None
    return render_page(
        request,
        "export.html",
        title="Export eval tasks",
        runs=runs,
        downloaded=downloaded,
        can_export=user.can("admin"),
        error=error,
    )


@router.post("/export", dependencies=[Depends(session_slot)])
def export_download(request: Request, form: FormData = Depends(posted)) -> Response:
    from vigil.export.redact import Redactor
    from vigil.export.run import export

    p = _admin(request, form, "/ui/export")
    rt = runtime_of(request)
    fmt = str(form.get("format") or "native")
    since_raw = str(form.get("since") or "").strip()
    # the checkbox sends "on" when ticked; a scripted post may send all=0 or all=false, which mean no
    every = str(form.get("all") or "").strip().lower() not in ("", "0", "false", "no", "off")

    def run(since: int | None) -> Any:
        with rt.sessions.begin() as s:
            return export(
                s,
                {r.id: r for r in rt.rules.rules},
                Redactor.of(rt.settings),
                fmt,
                since,
                every,
                p.name,
                rt.metrics,
                record=False,
                min_severity=rt.settings.export_min_criterion_severity,
            )

    try:
        result = run(_watermark(since_raw))
    except (ValueError, ExportError) as exc:
        return render_page(request, "error.html", 422, title="Export failed", message=str(exc), back="/ui/export")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    response = Response(
        b"".join(result.lines),
        media_type="application/x-ndjson",
        headers={
            "Content-Disposition": f'attachment; filename="vigil-{fmt}-run{result.run_id}-{stamp}.jsonl"',
            "X-Vigil-Export-Run": str(result.run_id),
            "X-Vigil-Export-State": result.state,
            "X-Vigil-Watermark": str(result.watermark),
            "X-Vigil-Tasks": str(result.tasks),
            "X-Vigil-Skipped": str(len(result.skipped)),  # which and why: `vigil export` lists them
            "X-Vigil-Checkable": str(result.checkable),
            "X-Vigil-Model-Graded": str(result.model_graded),
            "Cache-Control": "no-store",
        },
    )
    secure = rt.settings.review_cookie_secure
    response.set_cookie(
        DOWNLOADED, str(result.run_id), max_age=600, path="/ui/export", secure=secure, samesite="strict"
    )
    return response


@router.post("/export/{run_id}/ack", dependencies=[Depends(session_slot)])
def export_ack(
    request: Request, run_id: int = PathParam(ge=1, le=MAX_ID), form: FormData = Depends(posted)
) -> Response:
    """The admin saved the run's file: its conversations count as exported from now on."""
    from vigil.export.run import acknowledge

    _admin(request, form, "/ui/export")
    rt = runtime_of(request)
    try:
        with rt.sessions.begin() as s:
            acknowledge(s, run_id)
    except LookupError:
        return render_page(
            request, "error.html", 404, title="Not found", message=f"No export run {run_id}", back="/ui/export"
        )
    return RedirectResponse("/ui/export", status_code=303)
