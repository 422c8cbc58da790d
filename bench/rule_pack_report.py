"""How often each shipped rule pack flags τ² conversations whose ground-truth reward is 0 versus 1.

    python -m bench.rule_pack_report [--data DIR] [--packs 'rules/*.yaml']

Prints one Markdown table per pack: for every rule, the conversations it flags among those with
reward 0 and among those with reward 1 (count/total and rate). Only conversations a pack applies
to (its ``applies_to`` agents) count towards that pack. The numbers describe the rules; they are not a
classifier's score: a policy check can be right about a violation in a conversation that still earned
reward 1, and many failures (a wrong flight chosen) break no rule a trajectory check can see.
"""

from __future__ import annotations

import argparse
import glob
import sys
from collections import defaultdict
from pathlib import Path

from vigil.ingest.importers import load_file
from vigil.rules import RuleEngine, load_pack
from vigil.schema import Conversation

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tau2" / "trajectories"


def reward(conv: Conversation) -> int:
    value = next((o.value for o in conv.outcomes if o.type == "task_success"), 0.0)
    return 1 if value >= 1.0 else 0


def rate(k: int, n: int) -> str:
    return f"{k}/{n} ({k / n:.0%})" if n else "–"


def pack_table(path: Path, conversations: list[Conversation]) -> list[str]:
    spec, rules = load_pack(path)
    engine = RuleEngine(rules)
    totals = [0, 0]
    flagged: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    any_flag = [0, 0]
    for conv in conversations:
        if not engine.rules_for(conv.agent_id, conv.agent_version):
            continue
        r = reward(conv)
        totals[r] += 1
        hit = {f.rule_id for f in engine.evaluate(conv) if not f.details.get("rule_error")}
        for rule_id in hit:
            flagged[rule_id][r] += 1
        if any(rule.id in hit and rule.spec.severity != "info" for rule in rules):
            any_flag[r] += 1
    lines = [
        f"**{spec.pack}** (`{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}`): "
        f"{totals[0]} conversations with reward 0, {totals[1]} with reward 1",
        "",
        "| rule | type | severity | flags reward 0 | flags reward 1 |",
        "|---|---|---|---|---|",
    ]
    for rule in rules:
        k0, k1 = flagged[rule.id]
        cells = [rule.id, rule.type.name, rule.spec.severity, rate(k0, totals[0]), rate(k1, totals[1])]
        lines.append(f"| {' | '.join(cells)} |")
    overall = f"{rate(any_flag[0], totals[0])} | {rate(any_flag[1], totals[1])}"
    lines.append(f"| any rule above `info` | | | {overall} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Folder of τ² results files.")
    parser.add_argument("--packs", default=str(ROOT / "rules" / "*.yaml"), help="Glob of rule pack files.")
    ns = parser.parse_args()
    files = sorted(ns.data.glob("*.json"))
    if not files:
        sys.exit(f"no τ² results files in {ns.data}")
    conversations = [c for f in files for c in load_file(f, "tau2")]
    print(f"{len(conversations)} conversations from {len(files)} files in {ns.data}\n")
    for pack in sorted(glob.glob(ns.packs)):
        print("\n".join(pack_table(Path(pack), conversations)))
        print()


if __name__ == "__main__":
    main()
