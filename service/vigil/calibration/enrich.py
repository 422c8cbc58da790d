"""Calibration figures added to other stages' answers, through their extension hooks.

- ``rt.extras["judge_info_enrichers"]``: ``fn(session, infos)`` adds ``calibration`` (state, reason, kappa
  and labels of the current version) to each judge of ``GET /v1/judges``;
- ``rt.extras["compare_enrichers"]``: ``fn(session, result)`` adds ``calibration`` to each ``judge:NAME``
  row of ``GET /v1/compare`` / ``vigil compare``: the judge's state and, per version, the raw rate on the
  judge's random sample beside the corrected rate.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from vigil.calibration.overview import Calibration


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
        full = cal.judge(session, info["name"])
        v = _current(full)
        kappa, labels = _kappa(v)
        info["calibration"] = {
            "state": full["state"],
            "state_reason": full["state_reason"],
            "kappa": kappa,
            "labels": labels,
        }


def compare_rows(cal: Calibration, session: Session, result: dict[str, Any]) -> None:
    agent = result.get("agent_id")
    for row in result.get("signals", []):
        if not str(row.get("signal", "")).startswith("judge:"):
            continue
        full = cal.judge(session, row["signal"].split(":", 1)[1])
        v = _current(full)
        rates = {r["agent_version"]: r for r in (v or {}).get("rates", []) if r["agent_id"] == agent}
        row["calibration"] = {
            "state": full["state"],
            "judge_version": v["judge_version"] if v else None,
            "measured_on": v["measured_on"] if v else None,
            **{
                side: (
                    {
                        "raw": rates[ver]["raw"],
                        "corrected": rates[ver]["corrected"],
                        "reason": rates[ver]["reason"],
                    }
                    if ver in rates
                    else None
                )
                for side, ver in (
                    ("baseline", result["baseline"]["version"]),
                    ("candidate", result["candidate"]["version"]),
                )
            },
        }
