"""Calibration and export figures: (a) coverage of the corrected failure rate's 95% interval against the raw
judge rate, simulated for judges of known sensitivity and specificity; (b) time to build a judge's
calibration report and to export confirmed failures, with many labels and verdicts in the database.

    python -m bench.bench_calibration                       # SQLite in a temporary folder
    python -m bench.bench_calibration --db postgres --labels 20000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from vigil.app.runtime import build_runtime
from vigil.calibration.corrected import rogan_gladen
from vigil.calibration.overview import Calibration
from vigil.export.redact import Redactor
from vigil.export.run import export
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.schema import Conversation
from vigil.settings import Settings
from vigil.store.models import ReviewLabelRow, VerdictRow

ROOT = Path(__file__).resolve().parent.parent

SCENARIOS = [  # true rate, sensitivity, specificity, judged sample, labelled set
    (0.02, 0.90, 0.97, 5000, 500),
    (0.05, 0.80, 0.95, 3000, 400),
    (0.10, 0.85, 0.90, 2000, 300),
    (0.25, 0.90, 0.80, 1000, 200),
    (0.10, 0.70, 0.75, 2000, 150),
    (0.05, 0.95, 0.99, 5000, 100),  # few labels: about 5 failures, often all caught
    (0.10, 0.90, 0.95, 1000, 50),
]


def coverage(runs: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    print(f"(a) corrected vs raw, {runs} simulated runs each")
    cols = [
        "true rate",
        "Se",
        "Sp",
        "sample",
        "labels",
        "raw mean",
        "raw 95% covers",
        "corrected mean",
        "corrected covers",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p, se, sp, n, m in SCENARIOS:
        truth = rng.random((runs, n)) < p
        judged = np.where(truth, rng.random((runs, n)) < se, rng.random((runs, n)) < 1 - sp)
        q = judged.mean(1)
        h = rng.random((runs, m)) < p
        j = np.where(h, rng.random((runs, m)) < se, rng.random((runs, m)) < 1 - sp)
        n_pos, n_neg = h.sum(1), (~h).sum(1)
        with np.errstate(divide="ignore", invalid="ignore"):
            est, low, high = rogan_gladen(q, n, (h & j).sum(1) / n_pos, n_pos, (~h & ~j).sum(1) / n_neg, n_neg)
        ok = np.isfinite(est)
        cov = ((low <= p) & (p <= high))[ok].mean()
        half = 1.96 * np.sqrt(q * (1 - q) / n)
        raw_cov = ((q - half <= p) & (p <= q + half)).mean()
        print(
            f"| {p:.2f} | {se:.2f} | {sp:.2f} | {n} | {m} | {q.mean():.4f} | {raw_cov:.1%} | "
            f"{np.nanmean(est):.4f} | {cov:.1%} ({(~ok).sum()} runs without a correction) |"
        )


def database(url: str, labels: int) -> None:
    s = Settings(database_url=url, api_keys="a:admin:k", judges_dir=str(ROOT / "judges"))  # type: ignore[arg-type]
    rt = build_runtime(s, registry=CollectorRegistry())
    convs = list(Simulator(parse_versions("v1:0.3,v2:0.3"), 11).stream(labels))
    t0 = time.perf_counter()
    for i in range(0, len(convs), 500):
        rt.pipeline.process([Conversation.model_validate(c) for c in convs[i : i + 500]], "bench")
    rng = np.random.default_rng(1)
    with rt.sessions.begin() as session:
        rows = []
        for c in convs:
            fail = bool(c["metadata"].get("simulated_defect"))
            jf = rng.random() < (0.85 if fail else 0.08)
            rows.append(
                VerdictRow(
                    judge="support-generic",
                    judge_version="1",
                    conversation_id=c["conversation_id"],
                    revision=1,
                    agent_id=c["agent_id"],
                    agent_version=c["agent_version"],
                    verdict="fail" if jf else "pass",
                    categories=[],
                    model="m",
                    offline=False,
                    prompt_hash="h",
                    reason="sampled",
                )
            )
            rows.append(
                ReviewLabelRow(
                    conversation_id=c["conversation_id"],
                    revision=1,
                    reviewer="r",
                    label="confirmed_failure" if fail else "not_a_failure",
                    version=1,
                    is_current=True,
                    category="other" if fail else None,
                )
            )
        session.add_all(rows)
    print(
        f"\n(b) {labels} labelled conversations with verdicts on {url.split(':')[0]} "
        f"(loaded in {time.perf_counter() - t0:.1f}s)"
    )
    cal = Calibration(s, {"support-generic": "1"})
    t0 = time.perf_counter()
    with rt.sessions() as session:
        rep = cal.judge(session, "support-generic")
    v = rep["versions"][-1]
    print(
        f"judge report: {time.perf_counter() - t0:.2f}s "
        f"(kappa {v['review_queue']['agreement']['kappa']['value']:.3f}, {v['state']})"
    )
    for fmt in ("native", "inspect"):
        t0 = time.perf_counter()
        with rt.sessions.begin() as session:
            result = export(session, {r.id: r for r in rt.rules.rules}, Redactor(), fmt)
        took = time.perf_counter() - t0
        print(
            f"export {fmt}: {result.tasks} tasks ({result.grouped} grouped) in {took:.2f}s, "
            f"{(result.tasks + result.grouped) / took:.0f} confirmed failures/s"
        )
    rt.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--labels", type=int, default=5000)
    ap.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    coverage(a.runs, a.seed)
    if a.db == "postgres":
        from tests.support.services import postgres_database

        with postgres_database() as url:
            database(url, a.labels)
    else:
        with tempfile.TemporaryDirectory() as d:
            database(f"sqlite:///{d}/bench.db", a.labels)


if __name__ == "__main__":
    main()
