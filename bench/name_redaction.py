"""How many personal names survive export of the real τ² conversations, and what name redaction removes
that is not a name.

    python -m bench.name_redaction [--data /work/shared/data] [--samples 20]

Every τ² conversation is ingested into a throwaway SQLite store, confirmed as a failure and exported
(native format) as ``vigil export`` does. The names each conversation states (``first_name`` and
``last_name`` pairs and ``full_name`` values anywhere in its tool calls and results, read from the τ²
file itself, not through Vigil) are then looked up in its exported task: a full name survives when it
appears whole (case-insensitive, between word boundaries); a part survives when it appears as a word.
A part written in capitals of up to three letters (``MIA``) is an airport code, not a surviving name.
Each name redaction is checked against the text it replaced: one that replaced no stated name is a
false redaction (printed with its context); the parts redacted on their own outside an identifier are
printed with their context to be read by hand (a city, a colour or a product that shares a name).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

TAU2 = (
    "sierra_gpt-4.1_airline_default_gpt-4.1_1trials.json",
    "sierra_gpt-4.1_retail_defautl_gpt-4.1_1trials.json",
    "sierra_gpt-4.1_telecom_default_gpt-4.1_1trials.json",
    "sierra_testrun1_gpt-4.1-2025-04-14_telecom_no-user_gpt-4.1-2025-04-14_4trials_5tasks.json",
)


def stated_names(sim: dict[str, Any]) -> set[str]:
    """Full names a τ² simulation states in its tool calls and results."""
    out: set[str] = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, dict):
            first, last = obj.get("first_name"), obj.get("last_name")
            if isinstance(first, str) and isinstance(last, str):
                out.add(f"{first} {last}")
            if isinstance(obj.get("full_name"), str):
                out.add(obj["full_name"])
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)
        elif isinstance(obj, str) and obj[:1] in "{[":
            with contextlib.suppress(ValueError):
                walk(json.loads(obj))

    for m in sim["messages"]:
        walk(m.get("content"))
        for c in m.get("tool_calls") or []:
            walk(c.get("arguments"))
    return out


def _word(text: str) -> str:
    return rf"(?<![^\W_]){re.escape(text)}(?![^\W_])"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    ap.add_argument("--samples", type=int, default=20)
    args = ap.parse_args()

    from vigil.app.runtime import build_runtime
    from vigil.export.names import Names, fold
    from vigil.export.redact import Redactor
    from vigil.export.run import export
    from vigil.ingest.importers import load_file
    from vigil.settings import Settings
    from vigil.store.models import ReviewLabelRow

    names: dict[str, set[str]] = {}
    convs = []
    for name in TAU2:
        path = args.data / "tau2" / "trajectories" / name
        raw = {s["id"]: s for s in json.loads(path.read_text())["simulations"]}
        for c in load_file(path, "auto", None, None):
            sim = raw.get(c.conversation_id) or next(s for sid, s in raw.items() if sid in c.conversation_id)
            names[c.conversation_id] = stated_names(sim)
            convs.append(c)
    matches: list[tuple[str, int, int]] = []  # every name span found: the text, the span
    collected: list[set[str]] = []  # the names each task's redactor was given
    real_with_names, real_find = Redactor.with_names, Names.find

    def with_names(self: Redactor, values: Any) -> Redactor:
        collected.append(set(values))
        return real_with_names(self, collected[-1])

    def find(self: Names, text: str) -> Any:
        for start, end in real_find(self, text):
            matches.append((text, start, end))
            yield start, end

    Redactor.with_names, Names.find = with_names, find  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(database_url=f"sqlite:///{tmp}/vigil.db", metrics_port=0, otlp_grpc_port=0)  # type: ignore[call-arg]
        rt = build_runtime(settings, registry=CollectorRegistry())
        rt.pipeline.process(convs, "bench")
        with rt.sessions.begin() as s:
            s.add_all(
                ReviewLabelRow(
                    conversation_id=c.conversation_id,
                    revision=1,
                    reviewer="bench",
                    label="confirmed_failure",
                    version=1,
                    is_current=True,
                    category="other",
                )
                for c in convs
            )
        with rt.sessions.begin() as s:
            result = export(s, {r.id: r for r in rt.rules.rules}, Redactor.of(settings), "native", all_=True)
        rt.close()
    tasks = [json.loads(line) for line in result.lines]
    by_id = {c.conversation_id: c for c in convs}
    full = full_left = parts = parts_left = 0
    survivors: Counter[str] = Counter()
    redacted = wrong = 0
    wrong_samples: list[str] = []
    for t in tasks:
        cid = t["source"]["conversation_id"]
        stated = names[cid]
        if not stated:
            continue
        text = json.dumps(t, ensure_ascii=False)
        original = json.dumps(_unredacted(t, by_id[cid]), ensure_ascii=False)
        for n in stated:
            if not re.search(_word(n), original, re.I):
                continue  # stated after the failing turn: not in the task
            full += 1
            if re.search(_word(n), text, re.I):
                full_left += 1
                survivors[n] += 1
        for p in {p for n in stated for p in n.split()}:
            if re.search(_word(p), original, re.I):
                parts += 1
                for m in re.finditer(_word(p), text, re.I):
                    if m.group(0).isupper() and len(p) <= 3:
                        continue  # MIA: Miami's airport code, not Mia
                    parts_left += 1
                    survivors[f"part {p}: ...{text[max(0, m.start() - 60) : m.end() + 30]}..."] += 1
                    break
    truth = {fold(p) for ns in names.values() for n in ns for p in n.split()}
    not_names = {v for vs in collected for v in vs if not {fold(p) for p in v.split()} <= truth}
    lowercase: Counter[str] = Counter()
    alone: Counter[str] = Counter()
    for text, start, end in matches:
        redacted += 1
        value = text[start:end]
        context = text[max(0, start - 50) : end + 50]
        if not all(fold(p) in truth for p in re.findall(r"[^\W_]+", value)):
            wrong += 1
            wrong_samples.append(f"{value!r} in ...{context!r}...")
        elif not value[:1].isupper():
            lowercase[value] += 1  # in user ids and emails
        in_id = text[start - 1 : start] in ("_", ".") or text[end : end + 1] in ("_", "@", ".")
        if not re.search(r"[\s,.]", value) and not in_id and not re.search(r"_name: $", text[:start]):
            alone[f"{value!r} in {text[max(0, start - 40) : end + 40]!r}"] += 1
    print(f"tasks: {len(tasks)} ({sum(bool(names[t['source']['conversation_id']]) for t in tasks)} with a stated name)")
    print(f"full names in a task: {full}; surviving export: {full_left}")
    print(f"name parts in a task: {parts}; surviving export: {parts_left}")
    print(f"name spans redacted: {redacted}; of no stated name: {wrong}")
    for s in wrong_samples[: args.samples]:
        print("  ", s)
    print("surviving:", *survivors.most_common(10), sep="\n  ")
    print("values taken for names that no τ² name field holds:", sorted(not_names)[:20])
    print("written in lower case (user ids, emails):", lowercase.most_common(8))
    print(f"a part alone in text (not a name field, not in an id): {sum(alone.values())}, {len(alone)} contexts")
    for a, n in alone.most_common(args.samples):
        print(f"  {n} x {a}")


def _unredacted(task: dict[str, Any], conv: Any) -> dict[str, Any]:
    idx = task["failure"]["message_index"]
    return {"goal": task.get("goal"), "messages": [m.model_dump(mode="json") for m in conv.messages[: idx + 1]]}


if __name__ == "__main__":
    main()
