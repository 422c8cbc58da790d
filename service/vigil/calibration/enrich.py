"""Calibration figures added to other stages' answers, through their extension hooks.

- ``rt.extras["judge_info_enrichers"]``: ``fn(session, infos)`` adds ``calibration`` (state, reason, kappa
  and labels of the current version) to each judge of ``GET /v1/judges``;
- ``rt.extras["compare_enrichers"]``: ``fn(session, result)`` adds ``calibration`` to each ``judge:NAME``
  row of ``GET /v1/compare`` / ``vigil compare`` (of the judge's current mode): the judge's state and, per
  version, the row's own raw rate (the window's randomly sampled verdicts) beside the corrected rate.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from vigil.calibration.corrected import corrected_rate
from vigil.calibration.overview import OFFLINE, Calibration
from vigil.store.signals import OFFLINE_SUFFIX


def _current(full: dict[str, Any]) -> dict[str, Any] | None:
    versions = full["versions"]
    return next(
        (v for v in versions if v["judge_version"] == full["current_version"]),
        versions[-1] if versions else None,
    )


def _kappa(v: dict[str, Any] | None) -> tuple[float | None, int]:
    best: tuple[float | None, int] = (None, 0)
    for part in ("review_queue", "labelled_set"):
        r = (v or {}).get(part)
        if r and r["agreement"]["n"] > best[1]:
            best = (r["agreement"]["kappa"]["value"], r["agreement"]["n"])
    return best


def judge_infos(cal: Calibration, session: Session, infos: list[dict[str, Any]]) -> None:
    for info in infos:
        full, _ = cal.state(session, info["name"])
        v = _current(full)
        kappa, labels = _kappa(v)
        info["calibration"] = {
            "state": full["state"],
            "state_reason": full["state_reason"],
            "kappa": kappa,
            "labels": labels,
        }


def _judge_of(signal: str) -> tuple[str, bool]:
    name = signal.split(":", 1)[1]
    offline = name.endswith(OFFLINE_SUFFIX)
    return name.removesuffix(OFFLINE_SUFFIX), offline


def compare_rows(cal: Calibration, session: Session, result: dict[str, Any]) -> None:
    """Each judge row of the judge's current mode gets the raw rate on its own counts (the window's
    randomly sampled verdicts, from the rollups) beside the rate corrected for the judge's measured errors."""
    for row in result.get("signals", []):
        if not str(row.get("signal", "")).startswith("judge:"):
            continue
        name, offline = _judge_of(row["signal"])
        if offline != (cal.mode_of(name) == OFFLINE):
            continue  # the other mode's verdicts: a different instrument, whose errors were not measured
        full, measured = cal.state(session, name)
        v = _current(full)
        sides = {}
        for side in ("baseline", "candidate"):
            rate = corrected_rate(int(row[side].get("x") or 0), int(row[side].get("n") or 0), measured).as_dict()
            sides[side] = {k: rate[k] for k in ("raw", "corrected", "reason")}
        row["calibration"] = {
            "state": full["state"],
            "judge_version": v["judge_version"] if v else None,
            "measured_on": v["measured_on"] if v else None,
            **sides,
        }
