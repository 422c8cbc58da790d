"""Labelled sets on disk: ``judges/<name>/calibration/*.jsonl`` and the files ``vigil calibrate`` reads.

A labelled set has one JSON object per line::

    {"conversation": {...Conversation v1...}, "human": "fail", "category": "wrong_action"}
    {"conversation_id": "c-17", "human": "pass"}

``human`` is ``fail`` or ``pass`` (``confirmed_failure`` / ``not_a_failure`` are accepted too; ``unsure``
lines are counted and left out). ``category`` is optional. A line needs the conversation itself to be
judged, or only its id when a verdicts file gives the judge's answer.

A verdicts file holds a judge's existing answers, to measure it without calling it::

    {"conversation_id": "c-17", "verdict": "fail", "judge_version": "3", "categories": ["wrong_action"]}

A pairwise file holds a pairwise judge's choices in both orders, to measure its position bias::

    {"first_choice": "a", "second_choice": "b", "human": "a"}

(``human``, optional: the people's choice, ``a``, ``b`` or ``tie``, for the three-way agreement.)

Every error names the file and the line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from vigil.calibration.errors import CalibrationError
from vigil.schema import Conversation

HUMAN = {"fail": True, "confirmed_failure": True, "pass": False, "not_a_failure": False}
UNSURE = {"unsure", "skip", None}
VERDICTS = {"pass", "fail", "unscored"}
CHOICES = {"a", "b", "tie", None}


@dataclass(slots=True)
class LabelledItem:
    conversation_id: str
    human_fail: bool
    category: str | None = None
    conversation: Conversation | None = None


@dataclass(slots=True)
class LabelledSet:
    path: str
    items: list[LabelledItem] = field(default_factory=list)
    unsure: int = 0


@dataclass(slots=True)
class FileVerdict:
    verdict: str
    judge_version: str | None = None
    categories: list[str] = field(default_factory=list)


def _word(value: Any, allowed: Any, where: str, name: str, expected: str) -> str | None:
    """``value`` if it is a string (or null) among ``allowed``; else a :class:`CalibrationError` naming the field.

    The type is checked before membership: a list or an object read from JSON is not hashable, and must be
    refused as bad input rather than raise ``TypeError`` from a set lookup.
    """
    if (value is not None and not isinstance(value, str)) or value not in allowed:
        raise CalibrationError(f"{where}: {name} must be {expected}, not {value!r}")
    return value


def _conversation_id(value: Any, where: str, missing: str) -> str:
    """A line's ``conversation_id``: absent says what the line needs, another type says what it must be."""
    if value is None or value == "":
        raise CalibrationError(f"{where}: {missing}")
    if not isinstance(value, str):
        raise CalibrationError(f"{where}: conversation_id must be a string, not {value!r}")
    return value


def numbered(items: list[Any]) -> list[tuple[int, dict[str, Any]]]:
    """Items of a JSON array as numbered rows (1-based), each checked to be an object."""
    for no, obj in enumerate(items, 1):
        if not isinstance(obj, dict):
            raise CalibrationError(f"item {no}: must be a JSON object")
    return list(enumerate(items, 1))


def _lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read: {exc}") from None
    out = []
    for no, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise CalibrationError(f"{path}:{no}: not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise CalibrationError(f"{path}:{no}: each line must be a JSON object")
        out.append((no, obj))
    return out


def load_labels(path: Path) -> LabelledSet:
    """Read a labelled set; raises :class:`CalibrationError` naming the line of the first problem."""
    return parse_labels(_lines(path), str(path))


def parse_labels(rows: list[tuple[int, dict[str, Any]]], path: str) -> LabelledSet:
    """A labelled set from ``(line number, object)`` pairs (a file's lines, or an API request's items)."""
    out = LabelledSet(path)
    seen: set[str] = set()
    for no, obj in rows:
        where = f"{path}:{no}"
        human = _word(obj.get("human", obj.get("label")), HUMAN.keys() | UNSURE, where, "human", "fail or pass")
        if human in UNSURE:
            out.unsure += 1
            continue
        assert human is not None
        conv = None
        if obj.get("conversation") is not None:
            try:
                conv = Conversation.model_validate(obj["conversation"])
            except ValidationError as exc:
                first = exc.errors()[0]
                loc = "".join(f".{p}" for p in first["loc"])  # empty when the conversation is not an object
                raise CalibrationError(f"{where}: conversation{loc}: {first['msg']}") from None
            cid = conv.conversation_id
        else:
            cid = _conversation_id(obj.get("conversation_id"), where, "needs a conversation or a conversation_id")
        if cid in seen:
            raise CalibrationError(f"{where}: conversation {cid!r} is labelled twice")
        seen.add(cid)
        category = obj.get("category")
        if category is not None and not isinstance(category, str):
            raise CalibrationError(f"{where}: category must be a string")
        out.items.append(LabelledItem(cid, HUMAN[human], category, conv))
    if not out.items:
        raise CalibrationError(f"{path}: no labelled conversations (fail or pass)")
    return out


def load_verdicts(path: Path) -> dict[str, FileVerdict]:
    """Read a verdicts file: conversation id → the judge's verdict."""
    return parse_verdicts(_lines(path), str(path))


def parse_verdicts(rows: list[tuple[int, dict[str, Any]]], path: str) -> dict[str, FileVerdict]:
    out: dict[str, FileVerdict] = {}
    for no, obj in rows:
        where = f"{path}:{no}"
        cid = _conversation_id(obj.get("conversation_id"), where, "needs a conversation_id")
        verdict = _word(obj.get("verdict"), VERDICTS, where, "verdict", "pass, fail or unscored")
        assert verdict is not None
        if cid in out:
            raise CalibrationError(f"{where}: conversation {cid!r} has two verdicts")
        version = obj.get("judge_version")
        if version is not None and (isinstance(version, bool) or not isinstance(version, str | int | float)):
            raise CalibrationError(f"{where}: judge_version must be a string, not {version!r}")
        cats = obj.get("categories") or []
        if not isinstance(cats, list) or not all(isinstance(c, str) for c in cats):
            raise CalibrationError(f"{where}: categories must be a list of strings")
        out[cid] = FileVerdict(verdict, None if version is None else str(version), cats)
    return out


def load_pairwise(path: Path) -> tuple[list[str | None], list[str | None]]:
    """Read a pairwise file: the choices in original and in swapped order."""
    first: list[str | None] = []
    second: list[str | None] = []
    for no, obj in _lines(path):
        where = f"{path}:{no}"
        a = _word(obj.get("first_choice"), CHOICES, where, "first_choice", "a, b, tie or null")
        b = _word(obj.get("second_choice"), CHOICES, where, "second_choice", "a, b, tie or null")
        first.append(a)
        second.append(b)
    return first, second


def load_pairwise_human(path: Path) -> list[str | None]:
    """The human choices of a pairwise file (None where a line has none)."""
    out: list[str | None] = []
    for no, obj in _lines(path):
        h = _word(obj.get("human"), CHOICES, f"{path}:{no}", "human", "a, b, tie or null")
        out.append(h)
    return out


def judge_sets(judges_dir: str | Path, judge: str) -> list[Path]:
    """The labelled sets kept beside a judge's definition."""
    return sorted((Path(judges_dir) / judge / "calibration").glob("*.jsonl"))
