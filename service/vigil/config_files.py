"""Operator-edited YAML (rule packs, judge definitions, the flagging policy), read one strict way.

PyYAML keeps the last of two equal keys without a word, so a rule that says ``args:`` twice, or a judge
that says ``sampling:`` twice, silently loses the first: here that is a YAML error naming both lines.
A file past :data:`MAX_BYTES` is refused before it is parsed (a 50 MB pack took minutes of CPU and
gigabytes of memory to load, then held start-up).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError

MAX_BYTES = 1 << 20  # 1 MiB: the largest shipped pack is 12 KB


class TooLarge(yaml.YAMLError):
    """The file is larger than an operator's configuration file may be."""

    @staticmethod
    def describe(size: int) -> str:
        return f"{size:,} bytes, more than the {MAX_BYTES:,} a configuration file may hold"


_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_Base):  # type: ignore[misc]
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base constructor says so
                break
            if first is not None:
                raise ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} (first at line {first.start_mark.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` that refuses a mapping naming one key twice."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)


def load(path: Path) -> Any:
    """Read and parse one file: OSError, UnicodeDecodeError and yaml.YAMLError (:class:`TooLarge`,
    duplicate keys) are the caller's to word."""
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise TooLarge(TooLarge.describe(size))
    return safe_load(path.read_text(encoding="utf-8"))
