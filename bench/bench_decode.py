"""What exact integers cost the decoder: decode (and decode + default rules) with ``loads_exact`` against
plain ``orjson.loads``, alternated in one run, as a ratio (1.00 = no cost).

    python -m bench.bench_decode
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

import vigil.ingest.decode as decode
from bench.bench_pipeline import ROOT, simulated, tau2_messages
from vigil.rules import RuleEngine


def timed(raws: list[bytes], step: Callable[[bytes], Any]) -> float:
    t0 = time.perf_counter()
    for raw in raws:
        step(raw)
    return time.perf_counter() - t0


def ratio(raws: list[bytes], step: Callable[[bytes], Any], rounds: int = 7) -> float:
    exact = decode.loads_exact
    plain: list[float] = []
    checked: list[float] = []
    try:
        for _ in range(rounds):
            decode.loads_exact = orjson.loads
            plain.append(timed(raws, step))
            decode.loads_exact = exact
            checked.append(timed(raws, step))
    finally:
        decode.loads_exact = exact
    return min(checked) / min(plain)


def main() -> None:
    engine = RuleEngine.from_paths([ROOT / "rules" / "default.yaml"])
    sets = {"simulated": simulated(2000), "tau2": tau2_messages()}
    for label, raws in sets.items():
        size = sum(map(len, raws)) // len(raws)
        only = ratio(raws, lambda r: decode.decode_document(r, 10_000_000))
        both = ratio(raws, lambda r: engine.evaluate(decode.decode_document(r, 10_000_000)[0]))
        print(
            f"[{label}] {len(raws)} conversations, {size:,} bytes each: exact/plain time "
            f"decode {only:.3f}, decode + rules {both:.3f}"
        )


if __name__ == "__main__":
    main()
