"""Importers: recorded conversations from files into Vigil's schema (``vigil replay``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import orjson

from vigil.errors import VigilError
from vigil.schema import Conversation

Format = Literal["auto", "openai", "tau2", "tau-bench"]


class ImportError_(VigilError):
    """A file that no importer understands, or an item inside it that is malformed."""


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


def detect(data: Any) -> Format:
    if isinstance(data, dict) and "simulations" in data:
        return "tau2"
    if isinstance(data, list) and data and isinstance(data[0], dict) and "traj" in data[0]:
        return "tau-bench"
    return "openai"


def load_file(
    path: Path, fmt: Format = "auto", agent_id: str | None = None, agent_version: str | None = None
) -> Iterator[Conversation]:
    """Yield the conversations in ``path``; raises ImportError_ naming the file and item on bad input."""
    from vigil.ingest.importers import openai, tau2, tau_bench

    try:
        data = read_json_or_jsonl(path)
    except OSError as exc:
        raise ImportError_(f"{path}: {exc}") from None
    kind = detect(data) if fmt == "auto" else fmt
    if kind == "tau2" and not (isinstance(data, dict) and isinstance(data.get("simulations"), list)):
        raise ImportError_(f"{path}: not a τ²-bench results file (expected an object with 'simulations')")
    if kind == "tau-bench" and not (isinstance(data, list) and all(isinstance(x, dict) for x in data)):
        raise ImportError_(f"{path}: not a τ-bench trajectory file (expected a list of runs with 'traj')")
    if kind == "tau2":
        yield from tau2.convert(data, path, agent_id, agent_version)
    elif kind == "tau-bench":
        yield from tau_bench.convert(data, path, agent_id, agent_version)
    else:
        yield from openai.convert(data, path, agent_id, agent_version)
