"""Vigil's native format (OpenAI chat messages plus metadata), or bare ``{"messages": [...]}`` records."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from vigil.ingest.decode import describe_validation_error
from vigil.schema import Conversation


def convert(data: Any, path: Path, agent_id: str | None, agent_version: str | None) -> Iterator[Conversation]:
    from vigil.ingest.importers import ImportError_

    items = data if isinstance(data, list) else [data]
    for n, item in enumerate(items):
        if not isinstance(item, dict):
            raise ImportError_(f"{path}: item {n}: expected an object")
        item = dict(item)
        if "conversation_id" not in item:
            digest = hashlib.sha256(orjson.dumps(item.get("messages"), option=orjson.OPT_SORT_KEYS)).hexdigest()
            item["conversation_id"] = f"{path.stem}:{digest[:16]}"
        if agent_id:
            item["agent_id"] = agent_id
        if agent_version:
            item["agent_version"] = agent_version
        item.setdefault("agent_id", path.stem)
        item.setdefault("agent_version", "unknown")
        try:
            yield Conversation.model_validate(item)
        except ValidationError as exc:
            raise ImportError_(f"{path}: item {n}: {describe_validation_error(exc)}") from None
