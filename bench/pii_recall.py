"""Recall and precision of Vigil's PII and secret detector on its labelled corpus, per category.

    python -m bench.pii_recall [--corpus tests/rules/pii_corpus.yaml]

A labelled value counts as found when one detected span of its kind covers it whole (redaction then
leaves nothing of it). A detected span that covers no labelled value is a false positive: in a
negative text (order ids, timestamps, prices, prose) every detection is one. Prints a Markdown table.

    python -m bench.pii_recall --split

The same corpus with every text cut in two, as two consecutive assistant messages (streamed chunks:
nothing between them), at every place inside each labelled value: a value counts as found when a
value split across the two (:mod:`vigil.rules.pii_split`, as export redaction reads them) covers it
whole; a value found that covers none of the text's labelled values is a false positive. Negative texts
are cut at every place, and every value found across a cut (or after its keyword before the cut) is a
false positive.
A line says how many secrets the detector finds inside the parts of the cut negative texts, and how many of
them ``pii_leak`` does not report because the second part goes on from the first (``...password: Open`` +
`` Settings and tap Reset``: :func:`vigil.rules.pii_split.read_on`).
A line says how many cut values ``pii_leak`` flags at all: a finding of the value's kind overlaps it,
across the cut or inside one message (``sk-proj-`` then the rest of the key: the rest alone is a key).
The last says how many values that are none without their keyword (a password, a bare phone number, a
date of birth) are found whole when their text is cut anywhere before them: the keyword in the first
message, the value in the second.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vigil.rules.pii import KINDS, detect
from vigil.rules.pii_split import read_on, splits

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


def split_score(corpus: dict[str, Any]) -> dict[str, Score]:
    """Scores by category of every text cut in two inside each labelled value (negatives: everywhere)."""
    scores: dict[str, Score] = defaultdict(Score)
    flagged = 0

    def across(text: str, cut: int, extending: bool = True) -> list[tuple[str, int, int]]:
        texts = [text[:cut], text[cut:]]
        inside = [detect(t) for t in texts]
        at = (0, cut)  # where each text starts: a value after its keyword in the first lies in the second alone
        found = [
            (f.kind, at[f.parts[0].index] + f.parts[0].start, at[f.parts[-1].index] + f.parts[-1].end)
            for f in splits(texts, KINDS, inside, extending)
        ]
        if not extending:
            found += [(f.kind, f.start, f.end) for f in inside[0]] + [
                (f.kind, cut + f.start, cut + f.end) for f in inside[1]
            ]
        return found

    for case in corpus["positives"]:
        text, s = case["text"], scores[case["category"]]
        labelled = [(text.find(str(value)), text.find(str(value)) + len(str(value))) for _, value in case["values"]]
        for kind, value in case["values"]:
            start = text.find(str(value))
            end = start + len(str(value))
            for cut in range(start + 1, end):
                found = across(text, cut)
                s.values += 1
                s.detections += len(found)
                if any(k == kind and a <= start and end <= b for k, a, b in found):
                    s.found += 1
                else:
                    s.missed.append(f"{kind} {text[start:cut]!r} + {text[cut:end]!r} in {text!r}")
                # another labelled value of the text, in the second part after its keyword in the first, is no
                # false positive ("Call 4155550123 or 4155550124" cut inside the first number)
                wrong = [(k, a, b) for k, a, b in found if not any(a < y and x < b for x, y in labelled)]
                s.false_positives += len(wrong)
                s.spurious += [f"{k} {text[a:cut]!r} + {text[cut:b]!r} in {text!r}" for k, a, b in wrong]
                flagged += any(k == kind and a < end and start < b for k, a, b in across(text, cut, False))
    secrets_inside = read_on_from = 0
    for case in corpus["negatives"]:
        text, s = case["text"], scores[f"negative:{case['category']}"]
        for cut in range(1, len(text)):
            for kind, a, b in across(text, cut):
                s.detections += 1
                s.false_positives += 1
                s.spurious.append(f"{kind} {text[a:cut]!r} + {text[cut:b]!r} in {text!r}")
            parts = [text[:cut], text[cut:]]
            inside = [detect(t, ["secret"]) for t in parts]
            secrets_inside += len(inside[0]) + len(inside[1])
            read_on_from += len(list(read_on(parts, inside)))
    print(f"pii_leak flags {flagged} of {totals(scores).values} cut values (across the cut or inside one message)")
    print(
        f"secrets inside the parts of negative texts cut anywhere: {secrets_inside - read_on_from} reported, "
        f"{read_on_from} not (a word its keyword labels ending the first part, which the second goes on from)"
    )
    keyworded, found_after = _keyword_cuts(corpus)
    print(f"values that need their keyword, cut before them: {found_after} of {keyworded} found whole after the cut")
    return dict(scores)


def _keyword_cuts(corpus: dict[str, Any]) -> tuple[int, int]:
    """Every labelled value that is not one read alone (a password, a bare phone number, a date of birth
    without their keyword), with its text cut at every place before it: how many of these cuts find it
    whole in the second part, as one after its keyword in the first."""
    cuts = found = 0
    for case in corpus["positives"]:
        text = case["text"]
        for kind, value in case["values"]:
            start = text.find(str(value))
            end = start + len(str(value))
            if start == 0 or any(f.kind == kind and f.end > 0 for f in detect(text[start:end])):
                continue
            for cut in range(1, start + 1):
                texts = [text[:cut], text[cut:]]
                inside = [detect(t) for t in texts]
                spans = [(f.kind, cut + f.start, cut + f.end) for f in inside[1]]
                spans += [(f.kind, cut + f.parts[0].start, cut + f.parts[-1].end) for f in splits(texts, KINDS, inside)]
                cuts += 1
                found += any(k == kind and a <= start and end <= b for k, a, b in spans)
    return cuts, found


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
    parser.add_argument("--split", action="store_true", help="each text cut in two, inside each labelled value")
    args = parser.parse_args()
    scores = (split_score if args.split else score)(load(args.corpus))
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
