"""UI page ``/ui/calibration``: judges' state, agreement, raw and corrected rates."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from vigil.calibration.live import inter_reviewer
from vigil.calibration.overview import Calibration
from vigil.http import runtime_of
from vigil.http.auth import Principal
from vigil.ui.render import render_page, ui_user

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
    rt = runtime_of(request)
    cal = rt.get(Calibration)
    with rt.sessions() as s:
        names = cal.judge_names(s)
        judges = [cal.judge(s, n) for n in names]
        inter = inter_reviewer(s, rt.settings.agreement_max_labels)
    return render_page(
        request, "calibration.html", title="Judge calibration", judges=judges, inter=inter, metrics=METRICS
    )
