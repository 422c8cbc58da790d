"""UI pages: ``/ui/calibration`` (judges' state, agreement, raw and corrected rates) and ``/ui/export``."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response
from sqlalchemy import select

from ..api.auth import Principal
from ..web.render import render_page, sessions_of, ui_user
from .errors import ExportError
from .live import reviewer_labels
from .models import ExportRunRow
from .stats import inter_rater

router = APIRouter(prefix="/ui", include_in_schema=False)

METRICS = [
    ("percent_agreement", "Agreement"),
    ("kappa", "Cohen's κ"),
    ("tpr", "True-positive rate"),
    ("tnr", "True-negative rate"),
    ("precision", "Precision"),
]


@router.get("/calibration")
def calibration_page(request: Request, user: Principal = Depends(ui_user)) -> Response:
    rt = request.app.state.runtime
    cal = rt.extras["calibration"]
    with rt.sessions() as s:
        names = cal.judge_names(s)
        judges = [cal.judge(s, n) for n in names]
        inter = inter_rater(reviewer_labels(s))
    return render_page(
        request, "calibration.html", title="Judge calibration", judges=judges, inter=inter, metrics=METRICS
    )


@router.get("/export")
def export_page(request: Request, user: Principal = Depends(ui_user), error: str | None = None) -> Response:
    rt = request.app.state.runtime
    with rt.sessions() as s:
        runs = s.scalars(select(ExportRunRow).order_by(ExportRunRow.id.desc()).limit(50)).all()
    return render_page(
        request,
        "export.html",
        title="Export eval tasks",
        runs=runs,
        can_export=user.can("admin"),
        error=error,
    )


@router.post("/export")
async def export_download(request: Request) -> Response:
    from ..export.redact import Redactor
    from ..export.run import export

    form = dict(await request.form())
    sessions = sessions_of(request)
    if not sessions.csrf_ok(request, str(form.get("csrf", ""))):
        raise HTTPException(403, "missing or stale form token: reload the page and try again")
    p = sessions.principal(request)
    if p is None:
        raise HTTPException(303, "log in first", headers={"Location": "/ui/login?next=/ui/export"})
    if not p.can("admin"):
        raise HTTPException(403, "exporting needs an admin key")
    rt = request.app.state.runtime
    fmt = str(form.get("format") or "native")
    since_raw = str(form.get("since") or "").strip()
    try:
        since = int(since_raw) if since_raw else None
        with rt.sessions.begin() as s:
            result = export(
                s,
                {r.id: r for r in rt.rules.rules},
                Redactor(rt.settings.export_redact_patterns),
                fmt,
                since,
                bool(form.get("all")),
                p.name,
                rt.metrics,
            )
    except (ValueError, ExportError) as exc:
        return render_page(
            request, "error.html", 422, title="Export failed", message=str(exc), back="/ui/export"
        )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Response(
        b"".join(result.lines),
        media_type="application/x-ndjson",
        headers={
            "Content-Disposition": f'attachment; filename="vigil-{fmt}-{stamp}.jsonl"',
            "X-Vigil-Watermark": str(result.watermark),
            "X-Vigil-Tasks": str(result.tasks),
            "Cache-Control": "no-store",
        },
    )
