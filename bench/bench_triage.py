"""Triage figures: queue page latency with search, case-insensitive filters and sorts; the filter menus;
near-duplicate clustering of the open queue; labelling the largest cluster in one action.

    python -m bench.bench_triage --n 5000                    # Postgres on 127.0.0.1:5432 and SQLite
    python -m bench.bench_triage --db sqlite --n 20000
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench.bench_review import conversations, runtime
from vigil.review import clusters, insights, queue
from vigil.review.stage import ReviewStage


def _ms(fn: Callable[[], Any], repeat: int = 10) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def run(url: str, n: int) -> None:
    rt = runtime(url, True)
    convs = conversations(n, seed=5)
    for i in range(0, n, 500):
        rt.pipeline.process(convs[i : i + 500], "bench")
    st = rt.get(ReviewStage)
    user_text = next(m.text for m in convs[n // 2].messages if m.role == "user")
    term = " ".join(user_text.split()[-2:])
    with rt.sessions() as s:
        open_items = insights.list_queue(s, queue.QueueFilter(), "open", 1)["counts"]["open"]
        figures = {
            "queue page": _ms(lambda: insights.list_queue(s, queue.QueueFilter(), "open", 50)),
            "search text": _ms(lambda: insights.list_queue(s, queue.QueueFilter(search=term), "open", 50)),
            "search id": _ms(lambda: insights.list_queue(s, queue.QueueFilter(search=convs[7].conversation_id[-6:]))),
            "agent+version (any case)": _ms(
                lambda: insights.list_queue(s, queue.QueueFilter(agent="Support-Bot", version="V2"), "open", 50)
            ),
            "sort received": _ms(lambda: insights.list_queue(s, queue.QueueFilter(), "open", 50, sort="received")),
            "filter menus": _ms(lambda: insights.filter_options(s, list(st.rule_descriptions))),
            "near-duplicate clusters": _ms(lambda: clusters.open_clusters(s), repeat=3),
        }
        found = clusters.open_clusters(s)
    biggest = found[0] if found else None
    print(f"  {n} conversations, {open_items} open items, {len(found)} clusters of 2 or more")
    print("  " + ", ".join(f"{k} {v:,.1f} ms" for k, v in figures.items()))
    if biggest is not None:
        members = [m.conversation_id for m in biggest.members]
        t0 = time.perf_counter()
        with rt.sessions.begin() as s:
            out = clusters.label_cluster(
                s, members[0], members, "bench", queue.LabelIn("not_a_failure"), st.policy, st.metrics
            )
        dt = time.perf_counter() - t0
        print(
            f"  labelled the largest cluster ({len(members)} items, {len(out['labelled'])} labelled) in one action: "
            f"{1000 * dt:,.0f} ms"
        )
    rt.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--db", choices=["both", "sqlite", "postgres"], default="both")
    a = ap.parse_args()

    @contextlib.contextmanager
    def sqlite() -> Iterator[str]:
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/bench.db"

    from tests.support.services import postgres_database

    dbs: dict[str, Callable[[], contextlib.AbstractContextManager[str]]] = {
        "sqlite": sqlite,
        "postgres": postgres_database,
    }
    for name in ("sqlite", "postgres") if a.db == "both" else (a.db,):
        print(f"[{name}]")
        with dbs[name]() as url:
            run(url, a.n)


if __name__ == "__main__":
    main()
