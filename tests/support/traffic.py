"""Simulated traffic with a chosen defect, for comparing versions."""

from __future__ import annotations

import random

from vigil.ingest.simulate import Simulator, parse_versions


def clean(n: int, version: str, seed: int) -> list[dict]:
    return list(Simulator(parse_versions(f"{version}:0.0"), seed).stream(n))


def mixed(n: int, version: str, defect: str, share: float, seed: int, agent: str = "support-bot") -> list[dict]:
    """``n`` conversations of which about ``share`` carry ``defect`` and the rest none."""
    rng = random.Random(seed)
    bad = Simulator(parse_versions(f"{version}:1.0", agent), seed + 1)
    good = Simulator(parse_versions(f"{version}:0.0", agent), seed + 2)
    out = []
    for _ in range(n):
        if rng.random() < share:
            while (c := next(bad.stream(1)))["metadata"]["simulated_defect"] != defect:
                pass
            out.append(c)
        else:
            out.append(next(good.stream(1)))
    return out


def with_defect(n: int, version: str, defect: str, seed: int) -> list[dict]:
    out: list[dict] = []
    sim = Simulator(parse_versions(f"{version}:1.0"), seed)
    while len(out) < n:
        c = next(sim.stream(1))
        if c["metadata"]["simulated_defect"] == defect:
            out.append(c)
    return out


def cheaper(convs: list[dict]) -> list[dict]:
    for c in convs:
        c["usage"] = dict(c["usage"], cost_usd=c["usage"]["cost_usd"] * 0.6, latency_ms=c["usage"]["latency_ms"] / 2)
    return convs
