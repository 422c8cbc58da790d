"""How outcomes and review reasons read on the pages and in the CLI (plain functions: the CLI imports them
without the web stack)."""

from __future__ import annotations

from typing import Any

from vigil.schema import SUCCESS_TOLERANCE


def outcome_label(o: Any) -> str:
    """An outcome as a reviewer reads it: a task's grade says whether it succeeded ("task success" on a run
    that scored 0 read as a success at a glance), other types their name and any value but 1."""
    kind = str(o["type"] if isinstance(o, dict) else o.type)
    value = o.get("value") if isinstance(o, dict) else getattr(o, "value", None)
    if kind == "task_success" and isinstance(value, int | float):
        return "task succeeded" if value >= 1.0 - SUCCESS_TOLERANCE else f"task failed (reward {value:g})"
    label = kind.replace("_", " ")
    if isinstance(value, int | float) and value != 1:
        return f"{label} {value:g}"
    return label


def reason_key(r: Any) -> str:
    """What a review reason is about: a task_success outcome flags only a failed task, so it says that."""
    kind = r["kind"] if isinstance(r, dict) else r.kind
    key = str(r["key"] if isinstance(r, dict) else r.key)
    return "task failed" if kind == "outcome" and key == "task_success" else key
