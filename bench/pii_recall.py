"""Recall and precision of Vigil's PII and secret detector on its labelled corpus, per category.

    python -m bench.pii_recall [--corpus tests/rules/pii_corpus.yaml]

A labelled value counts as found when one detected span of its kind covers it whole (redaction then
leaves nothing of it). A detected span that covers no labelled value is a false positive: in a
negative text (order ids, timestamps, prices, prose) every detection is one. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vigil.rules.pii import detect

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "rules" / "pii_corpus.yaml"


@dataclass
class Score:
    values: int = 0
    found: int = 0
    detections: int = 0
    false_positives: int = 0
    missed: list[str] = field(default_factory=list)
    spurious: list[str] = field(default_factory=list)

    @property
    def recall(self) -> float:
        return self.found / self.values if self.values else 1.0

    @property
    def precision(self) -> float:
        return 1 - self.false_positives / self.detections if self.detections else 1.0


def load(path: Path = CORPUS) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def score(corpus: dict[str, Any]) -> dict[str, Score]:
    """Scores by category (negatives under ``negative:<category>``)."""
    scores: dict[str, Score] = defaultdict(Score)
    for case in corpus["positives"]:
        text, s = case["text"], scores[case["category"]]
        spans = detect(text)
        labelled = []
        for kind, value in case["values"]:
            at = text.find(str(value))
            assert at >= 0, f"corpus error: {value!r} not in {text!r}"
            labelled.append((kind, at, at + len(str(value))))
        s.values += len(labelled)
        for kind, start, end in labelled:
            if any(f.kind == kind and f.start <= start and end <= f.end for f in spans):
                s.found += 1
            else:
                s.missed.append(f"{kind} {text[start:end]!r} in {text!r}: found {_shown(text, spans)}")
        for f in spans:
            s.detections += 1
            if not any(f.start < end and start < f.end for _, start, end in labelled):
                s.false_positives += 1
                s.spurious.append(f"{f.kind} {text[f.start : f.end]!r} in {text!r}")
    for case in corpus["negatives"]:
        text, s = case["text"], scores[f"negative:{case['category']}"]
        for f in detect(text):
            s.detections += 1
            s.false_positives += 1
            s.spurious.append(f"{f.kind} {text[f.start : f.end]!r} in {text!r}")
    return dict(scores)


def _shown(text: str, spans: list[Any]) -> str:
    return ", ".join(f"{f.kind} {text[f.start : f.end]!r}" for f in spans) or "nothing"


def totals(scores: dict[str, Score]) -> Score:
    total = Score()
    for s in scores.values():
        total.values += s.values
        total.found += s.found
        total.detections += s.detections
        total.false_positives += s.false_positives
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    args = parser.parse_args()
    scores = score(load(args.corpus))
    print("| category | values | found | recall | detections | false positives | precision |")
    print("|---|---|---|---|---|---|---|")
    for name, s in sorted(scores.items(), key=lambda kv: (kv[0].startswith("negative:"), kv[0])):
        print(
            f"| {name} | {s.values} | {s.found} | {s.recall:.0%} | {s.detections} | {s.false_positives} "
            f"| {s.precision:.0%} |"
        )
    t = totals(scores)
    cells = [t.values, t.found, f"{t.recall:.1%}", t.detections, t.false_positives, f"{t.precision:.1%}"]
    print("| **all** | " + " | ".join(map(str, cells)) + " |")
    for s in scores.values():
        for line in s.missed:
            print("missed:", line)
        for line in s.spurious:
            print("false positive:", line)


if __name__ == "__main__":
    main()
