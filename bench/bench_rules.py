"""The rule engine alone on the real τ² conversations: CPU per conversation, and per rule.

    python -m bench.bench_rules [--passes 5] [--packs 'rules/*.yaml'] [--profile]
    python -m bench.bench_rules --save findings.json     # every conversation's findings, to compare
    python -m bench.bench_rules --compare findings.json  # the same findings as a saved run, or exit 1

Each pass decodes the 120 τ² conversations as the consumer does (so every pass sees new string
objects, as a stream would) and runs ``RuleEngine.evaluate`` with every shipped pack. Prints the
median over the passes of the thread's CPU time per conversation, then each rule type's share
(every rule run on its own, outside the engine, over the same conversations; top 10).
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from bench.bench_pipeline import tau2_messages
from vigil.ingest.decode import decode_conversation
from vigil.rules import ConversationView, RuleEngine

ROOT = Path(__file__).resolve().parent.parent


def findings_of(engine: RuleEngine, raws: list[bytes]) -> dict[str, list[list[object]]]:
    out: dict[str, list[list[object]]] = {}
    for n, raw in enumerate(raws):
        conv = decode_conversation(raw, 10_000_000)
        out[f"{n}:{conv.conversation_id}"] = [
            [f.rule_id, f.severity, f.message, [e.as_dict() for e in f.evidence], f.details]
            for f in engine.evaluate(conv)
        ]
    return json.loads(json.dumps(out, sort_keys=True, default=str))


def one_pass(engine: RuleEngine, raws: list[bytes]) -> float:
    """Microseconds of thread CPU per conversation, rules only (decoding is outside the clock)."""
    convs = [decode_conversation(raw, 10_000_000) for raw in raws]
    t0 = time.thread_time()
    for conv in convs:
        engine.evaluate(conv)
    return (time.thread_time() - t0) / len(convs) * 1e6


def per_rule(engine: RuleEngine, raws: list[bytes]) -> dict[str, float]:
    spent: dict[str, float] = defaultdict(float)
    convs = [decode_conversation(raw, 10_000_000) for raw in raws]
    for conv in convs:
        view = ConversationView(conv)
        for rule in engine.rules_for(conv.agent_id, conv.agent_version):
            t0 = time.thread_time()
            list(rule.type.fn(view, rule.args))
            spent[f"{rule.type.name} ({rule.id})"] += time.thread_time() - t0
    return {k: v / len(convs) * 1e6 for k, v in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--packs", default=str(ROOT / "rules" / "*.yaml"))
    ap.add_argument("--profile", action="store_true", help="cProfile one pass, top 25 by own time")
    ap.add_argument("--sort", default="tottime", help="cProfile sort key")
    ap.add_argument("--save", type=Path, help="write every conversation's findings to this JSON file")
    ap.add_argument("--compare", type=Path, help="exit 1 unless the findings equal this saved file's")
    a = ap.parse_args()
    engine = RuleEngine.from_paths([Path(p) for p in sorted(glob.glob(a.packs))])
    raws = tau2_messages()
    if a.save or a.compare:
        found = findings_of(engine, raws)
        if a.save:
            a.save.write_text(json.dumps(found, sort_keys=True, indent=0))
            print(f"{sum(map(len, found.values()))} findings of {len(found)} conversations saved to {a.save}")
        if a.compare:
            saved = json.loads(a.compare.read_text())
            differ = [k for k in sorted(set(saved) | set(found)) if saved.get(k) != found.get(k)]
            print(f"{len(found) - len(differ)}/{len(found)} conversations with the same findings as {a.compare}")
            for k in differ[:10]:
                print(f"  differs: {k}")
            if differ:
                sys.exit(1)
        return
    if a.profile:
        import cProfile
        import pstats

        one_pass(engine, raws)  # warm: compiled patterns, per-process caches
        convs = [decode_conversation(raw, 10_000_000) for raw in raws]
        prof = cProfile.Profile()
        prof.enable()
        for conv in convs:
            engine.evaluate(conv)
        prof.disable()
        pstats.Stats(prof).sort_stats(a.sort).print_stats(40)
        return
    one_pass(engine, raws)  # warm: compiled patterns, per-process caches
    runs = [one_pass(engine, raws) for _ in range(a.passes)]
    print(
        f"rule engine, {len(engine.rules)} rules, {len(raws)} τ² conversations: "
        f"{statistics.median(runs):,.0f} µs CPU per conversation "
        f"(median of {a.passes} passes: {', '.join(f'{r:,.0f}' for r in runs)})"
    )
    shares = sorted(per_rule(engine, raws).items(), key=lambda kv: -kv[1])
    print(f"per rule (each run alone, µs per conversation; all {len(shares)}: {sum(v for _, v in shares):,.0f}):")
    for name, us in shares[:10]:
        print(f"  {us:8.1f}  {name}")


if __name__ == "__main__":
    main()
