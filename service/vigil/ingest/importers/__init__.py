"""Importers: recorded conversations from files (or request bodies) into Vigil's schema.

Each format has a detector that looks for what only that format has, and a converter that reads it
strictly: a block, item or span kind it does not know is refused by name, never skipped or misread.
``auto`` picks the one format whose detector matches and says which; no match, or more than one, is
refused with an error naming every format tried.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from vigil.ingest.importers.common import ImportError_, ItemError
from vigil.schema import Conversation

__all__ = ["FORMATS", "Format", "ImportError_", "Imported", "convert_data", "detect", "load_file", "read_file"]

Format = Literal["auto", "openai", "openai-responses", "anthropic", "openai-agents", "langsmith", "tau2", "tau-bench"]


@dataclass(frozen=True, slots=True)
class Spec:
    name: str
    title: str
    convert: Callable[[Any, Path, str | None, str | None], Iterator[Conversation]]


def _specs() -> dict[str, Spec]:
    from vigil.ingest.importers import anthropic, langsmith, openai, openai_agents, responses, tau2, tau_bench

    mods = (openai, responses, anthropic, openai_agents, langsmith)
    specs = {m.NAME: Spec(m.NAME, m.TITLE, m.convert) for m in mods}
    specs["tau2"] = Spec("tau2", "τ²-bench results ({info, tasks, simulations})", tau2.convert)
    specs["tau-bench"] = Spec("tau-bench", "τ-bench trajectories ([{task_id, reward, traj, trial}])", tau_bench.convert)
    return specs


FORMATS: tuple[str, ...] = (
    "openai",
    "openai-responses",
    "anthropic",
    "openai-agents",
    "langsmith",
    "tau2",
    "tau-bench",
)


@dataclass(slots=True)
class Imported:
    format: str
    title: str
    conversations: list[Conversation]


def _records(data: Any) -> list[Any]:
    return data if isinstance(data, list) else [data]


def matches(data: Any) -> dict[str, str]:
    """Every format whose detector matches ``data``, with what it saw."""
    from vigil.ingest.importers import anthropic, langsmith, openai, openai_agents, responses

    found: dict[str, str] = {}
    records = _records(data)
    if isinstance(data, dict) and isinstance(data.get("simulations"), list):
        found["tau2"] = "an object with simulations"
    if isinstance(data, list) and data and all(isinstance(x, dict) and "traj" in x for x in data):
        found["tau-bench"] = "runs with traj"
    if openai.sniff(records):
        objects = [r for r in records if isinstance(r, dict)]
        anthropic_only = anthropic.markers(objects)
        openai_only = openai.markers(objects)
        if anthropic_only:
            found["anthropic"] = ", ".join(anthropic_only)
        if openai_only or not anthropic_only:
            found["openai"] = ", ".join(openai_only) or "messages records (plain turns read the same in every format)"
    if responses.sniff_items(data):
        found["openai-responses"] = "a list of Responses items"
    elif responses.sniff_records(records):
        found["openai-responses"] = "records with input/output items"
    if openai_agents.sniff(data):
        found["openai-agents"] = "trace and trace.span objects"
    if langsmith.sniff(data):
        found["langsmith"] = "runs with run_type, inputs and outputs"
    return found


def detect(data: Any) -> str:
    """The one format ``data`` is in; raises ItemError naming the formats tried when none or several match."""
    found = matches(data)
    if len(found) == 1:
        return next(iter(found))
    tried = ", ".join(FORMATS)
    if not found:
        shape = type(data).__name__
        if isinstance(data, dict):
            shape = "an object with keys " + ", ".join(sorted(map(str, data))[:8])
        elif isinstance(data, list) and data and isinstance(data[0], dict):
            shape = "a list of objects with keys " + ", ".join(sorted(map(str, data[0]))[:8])
        raise ItemError(f"unknown shape ({shape}); tried {tried}; see docs/formats.md")
    seen = "; ".join(f"{name} ({why})" for name, why in found.items())
    raise ItemError(f"ambiguous shape: it matches {seen}; tried {tried}; pass --format to choose one")


def read_json_or_jsonl(path: Path) -> Any:
    data = path.read_bytes()
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        items = []
        for n, line in enumerate(data.splitlines(), 1):
            if line.strip():
                try:
                    items.append(orjson.loads(line))
                except orjson.JSONDecodeError as exc:
                    raise ImportError_(f"{path}:{n}: not JSON: {exc}") from None
        return items


def convert_data(
    data: Any,
    fmt: str = "auto",
    source: Path = Path("body"),
    agent_id: str | None = None,
    agent_version: str | None = None,
) -> Imported:
    """Parsed JSON in ``fmt`` (or the format detected) as conversations; raises ImportError_ naming ``source``."""
    specs = _specs()
    try:
        kind = detect(data) if fmt == "auto" else fmt
        if kind not in specs:
            raise ItemError(f"unknown format {fmt!r}; formats: auto, {', '.join(FORMATS)}")
        if kind == "tau2" and not (isinstance(data, dict) and isinstance(data.get("simulations"), list)):
            raise ItemError("not a τ²-bench results file (expected an object with 'simulations')")
        if kind == "tau-bench" and not (isinstance(data, list) and all(isinstance(x, dict) for x in data)):
            raise ItemError("not a τ-bench trajectory file (expected a list of runs with 'traj')")
        convs = list(specs[kind].convert(data, source, agent_id, agent_version))
    except ItemError as exc:
        raise ImportError_(f"{source}: {exc}") from None
    if not convs:
        raise ImportError_(f"{source}: no conversations in this {specs[kind].title} file")
    return Imported(kind, specs[kind].title, convs)


def read_file(path: Path, fmt: str = "auto", agent_id: str | None = None, agent_version: str | None = None) -> Imported:
    """The conversations in ``path`` and the format they were read as; raises ImportError_ naming the file."""
    try:
        data = read_json_or_jsonl(path)
    except OSError as exc:
        raise ImportError_(f"{path}: {exc}") from None
    return convert_data(data, fmt, path, agent_id, agent_version)


def load_file(
    path: Path, fmt: Format = "auto", agent_id: str | None = None, agent_version: str | None = None
) -> Iterator[Conversation]:
    """Yield the conversations in ``path``; raises ImportError_ naming the file and item on bad input."""
    yield from read_file(path, fmt, agent_id, agent_version).conversations
