"""How outcomes and review reasons read on the pages and in the CLI (plain functions: the CLI imports them
without the web stack). Both take the dicts the read paths build (``reads.conversation_dict``'s outcomes,
``insights``' reasons)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vigil.schema import SUCCESS_TOLERANCE


def outcome_label(o: Mapping[str, Any]) -> str:
    """An outcome as a reviewer reads it: a task's grade says whether it succeeded ("task success" on a run
    that scored 0 read as a success at a glance), other types their name and any value but 1."""
    kind, value = str(o["type"]), o.get("value")
    if kind == "task_success" and isinstance(value, int | float):
        return "task succeeded" if value >= 1.0 - SUCCESS_TOLERANCE else f"task failed (reward {value:g})"
    label = kind.replace("_", " ")
    if isinstance(value, int | float) and value != 1:
        return f"{label} {value:g}"
    return label


def reason_key(r: Mapping[str, Any]) -> str:
    """What a review reason is about: a task_success outcome flags only a failed task, so it says that."""
    key = str(r["key"])
    return "task failed" if r["kind"] == "outcome" and key == "task_success" else key
