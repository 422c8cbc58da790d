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
from vigil.schema import Conversation, loads_exact

__all__ = [
    "BOM",
    "FORMATS",
    "MALFORMED",
    "Format",
    "ImportError_",
    "Imported",
    "Refused",
    "convert_data",
    "detect",
    "load_file",
    "malformed",
    "read_file",
    "read_file_partial",
    "read_file_parts",
]

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


# What a converter may raise on a field of an unexpected type it did not check for itself. Every one of
# them becomes a refusal naming the format (and how far the reading got), never a crash.
MALFORMED: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    AttributeError,
    KeyError,
    IndexError,
    RecursionError,
)


def _records(data: Any) -> list[Any]:
    return data if isinstance(data, list) else [data]


def matches(data: Any) -> dict[str, str]:
    """Every format whose detector matches ``data``, with what it saw.

    Detectors look at data of every shape, most of it another format's: one that fails on a value of a type
    it did not expect (:data:`MALFORMED`) has not matched, and never fails the detection."""
    from vigil.ingest.importers import anthropic, langsmith, openai, openai_agents, responses

    found: dict[str, str] = {}
    records = _records(data)

    def safely(check: Callable[[], Any]) -> Any:
        try:
            return check()
        except MALFORMED:
            return None

    if isinstance(data, dict) and isinstance(data.get("simulations"), list):
        found["tau2"] = "an object with simulations"
    if isinstance(data, list) and data and all(isinstance(x, dict) and "traj" in x for x in data):
        found["tau-bench"] = "runs with traj"
    elif isinstance(data, dict) and "traj" in data:
        found["tau-bench"] = "a run with traj"
    if safely(lambda: openai.sniff(records)):
        objects = [r for r in records if isinstance(r, dict)]
        anthropic_only = safely(lambda: anthropic.markers(objects)) or []
        openai_only = safely(lambda: openai.markers(objects)) or []
        if anthropic_only:
            found["anthropic"] = ", ".join(anthropic_only)
        if openai_only or not anthropic_only:
            found["openai"] = ", ".join(openai_only) or "messages records (plain turns read the same in every format)"
    if safely(lambda: responses.sniff_items(data)):
        found["openai-responses"] = "a list of Responses items"
    elif safely(lambda: responses.sniff_records(records)):
        found["openai-responses"] = "records with input/output items"
    if safely(lambda: openai_agents.sniff(data)):
        found["openai-agents"] = "trace and trace.span objects"
    if safely(lambda: langsmith.sniff(data)):
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


BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark: Windows tools write one; JSON readers may ignore it (RFC 8259)


def read_json_or_jsonl(path: Path) -> Any:
    data = path.read_bytes().removeprefix(BOM)
    try:
        return loads_exact(data)
    except orjson.JSONDecodeError:
        items = []
        for n, line in enumerate(data.splitlines(), 1):
            if line.strip():
                try:
                    items.append(loads_exact(line))
                except orjson.JSONDecodeError as exc:
                    raise ImportError_(f"{path}:{n}: not JSON: {exc}") from None
        return items


def malformed(source: Path | str, kind: str, exc: BaseException, read: int | None = None) -> ImportError_:
    """The refusal of input on which an importer failed unexpectedly: the format, how far it got, the error."""
    at = f" (after {read} conversation(s) read)" if read else ""
    what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, KeyError):
        what = f"missing field {exc}"
    return ImportError_(
        f"{source}: not readable as {kind}{at}: a field is missing or of the wrong type ({what[:300]}); "
        "see docs/formats.md"
    )


def convert_data(
    data: Any,
    fmt: str = "auto",
    source: Path = Path("body"),
    agent_id: str | None = None,
    agent_version: str | None = None,
) -> Imported:
    """Parsed JSON in ``fmt`` (or the format detected) as conversations; raises ImportError_ naming ``source``.

    Whatever the input, the answer is conversations or an ImportError_: an error a converter raises on a
    field of an unexpected type (:data:`MALFORMED`) is refused naming the format, never passed on."""
    specs = _specs()
    kind = fmt
    convs: list[Conversation] = []
    try:
        kind = detect(data) if fmt == "auto" else fmt
        if kind not in specs:
            raise ItemError(f"unknown format {fmt!r}; formats: auto, {', '.join(FORMATS)}")
        if kind == "tau2" and not (isinstance(data, dict) and isinstance(data.get("simulations"), list)):
            raise ItemError("not a τ²-bench results file (expected an object with 'simulations')")
        if kind == "tau-bench" and isinstance(data, dict) and "traj" in data:
            data = [data]  # one run: a file of JSON lines holding one line, or one run sent over HTTP
        if kind == "tau-bench" and not (isinstance(data, list) and all(isinstance(x, dict) for x in data)):
            raise ItemError("not a τ-bench trajectory file (expected a list of runs with 'traj')")
        convs.extend(specs[kind].convert(data, source, agent_id, agent_version))
    except ItemError as exc:
        raise ImportError_(f"{source}: {exc}") from None
    except MALFORMED as exc:
        what = kind if kind != "auto" else "any format (detecting it failed)"
        raise malformed(source, what, exc, len(convs)) from None
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


@dataclass(slots=True)
class Refused:
    """A part of a file an import could not read: the whole file (``line`` None) or one of its JSON lines."""

    path: Path
    line: int | None
    reason: str  # malformed_json or schema_invalid (a decoder reason), or unreadable (the file itself)
    detail: str
    raw: bytes

    def __str__(self) -> str:
        where = f"line {self.line} of {self.path}" if self.line is not None else str(self.path)
        return f"{where}: {self.detail}"


# Formats in which each JSON line is a record of its own; a file of such lines is read line by line when one
# of them cannot be. (In the others a conversation spans lines: the spans of a trace, the runs of a tree.)
PER_RECORD = frozenset({"openai", "anthropic", "openai-responses", "tau-bench"})


def _detail(exc: ImportError_, path: Path, single: bool = False) -> str:
    """The refusal's text without the file it names (the caller says where), and, for one record read on
    its own, without its index among the records read (always 0)."""
    text = str(exc).removeprefix(f"{path}: ")
    if single:
        text = text.removeprefix("item 0: ")
        text = text[len("item 0.") :] if text.startswith("item 0.") else text
    return text


def read_file_partial(
    path: Path, fmt: str = "auto", agent_id: str | None = None, agent_version: str | None = None
) -> tuple[Imported | None, list[Refused]]:
    """What ``path`` holds that can be read, and what cannot (never raises on the file's content).

    A JSON document is read whole: its conversations, or one refusal. A file of JSON lines keeps what its
    good lines hold: a line that is not JSON is refused by its number; when the lines together cannot be
    read and each is a record of its own (:data:`PER_RECORD`), each is read alone and the ones that cannot
    be are refused by number. A shape no format reads, or several, is refused whole, as :func:`read_file`
    refuses it."""
    try:
        if path.is_file():
            opening = _opening(path)
            if opening is not None:  # not JSON from its first byte: refused without reading it all
                return None, [Refused(path, None, "malformed_json", opening, b"")]
            body = path.read_bytes()
        else:  # a pipe, a FIFO, /dev/stdin: what is read of it is gone, so it is read once, whole
            body = path.read_bytes()
            opening = _opening_of(body[:65536])
            if opening is not None:
                return None, [Refused(path, None, "malformed_json", opening, b"")]
    except OSError as exc:
        return None, [Refused(path, None, "unreadable", str(exc), b"")]
    body = body.removeprefix(BOM)
    try:
        data: Any = loads_exact(body)
    except orjson.JSONDecodeError as whole:
        lines = [(n, line) for n, line in enumerate(body.splitlines(), 1) if line.strip()]
        return _from_lines(path, lines, fmt, agent_id, agent_version, body, whole)
    try:
        return convert_data(data, fmt, path, agent_id, agent_version), []
    except ImportError_ as exc:
        return None, [Refused(path, None, "schema_invalid", _detail(exc, path), body)]


def _opening(path: Path, peek: int = 65536) -> str | None:
    """Why ``path`` cannot be JSON (a document or JSON lines) by its first non-blank byte, or None. A 2 GB
    sparse file of NUL bytes was read whole (6.5 GB of memory, 29 s) before orjson refused it."""
    with path.open("rb") as fh:
        head = fh.read(peek)
    return _opening_of(head)


def _opening_of(head: bytes) -> str | None:
    """:func:`_opening` of the first bytes of a file; a UTF-8 byte order mark before them is skipped."""
    start = head.removeprefix(BOM).lstrip(b" \t\r\n")
    if not start or start[:1] in (b"{", b"["):
        return None
    return (
        f"not JSON: the file starts with byte 0x{start[0]:02x} at offset {len(head) - len(start)}; "
        "Vigil reads JSON documents and JSON lines"
    )


def _detect_lines(records: list[Any]) -> str:
    """The format of a file's JSON lines: :func:`detect` of them all, or else, when more than half of them
    are records some format reads on its own, the format of those (one bad record among 30,000 OpenAI chat
    records lost the file: no format reads a record whose ``messages`` is a string, so none matched them
    all). Only a format whose lines are records of their own (:data:`PER_RECORD`) is found the second way:
    the caller then reads each line alone and refuses the others by number."""
    try:
        return detect(records)
    except ItemError as exc:
        readable = [r for r in records if matches([r])]
        if len(readable) * 2 <= len(records):
            raise exc from None
        kind = detect(readable)
        if kind not in PER_RECORD:
            raise exc from None
        return kind


def _from_lines(
    path: Path,
    lines: list[tuple[int, bytes]],
    fmt: str,
    agent_id: str | None,
    agent_version: str | None,
    body: bytes,
    whole: Exception | None = None,
) -> tuple[Imported | None, list[Refused]]:
    """The conversations of numbered JSON lines (all of a file's, or one part of a file read in parts, see
    :func:`read_file_parts`) and the refusals of what cannot be read; ``body`` is what a refusal of them all
    keeps, and ``whole`` why the file is not one JSON document (None: a part, whose lines are refused by
    number even when none is JSON)."""
    refused: list[Refused] = []
    numbered: list[tuple[int, bytes]] = []
    data: list[Any] = []
    for n, line in lines:
        try:
            data.append(loads_exact(line))
        except orjson.JSONDecodeError as exc:
            refused.append(Refused(path, n, "malformed_json", f"not JSON: {exc}", line))
            continue
        numbered.append((n, line))
    if not numbered:
        if whole is None:
            return None, refused
        return None, [Refused(path, None, "malformed_json", f"not JSON: {whole}", body)]
    if whole is not None and len(refused) > len(numbered):
        # most lines are not JSON: one JSON document (pretty-printed) broken somewhere, not JSON lines with
        # a few bad ones; one refusal saying where it breaks, not one per line of it
        why = f"not JSON: {whole} (and {len(refused)} of its {len(lines)} lines are not JSON lines either)"
        return None, [Refused(path, None, "malformed_json", why, body)]
    if refused:  # lines that are not JSON: skipping them is safe only where each line is a record
        try:
            kind = _detect_lines(data) if fmt == "auto" else fmt
        except ItemError:
            kind = "auto"
        if kind not in PER_RECORD:
            lines_ = ", ".join(str(r.line) for r in refused[:10])
            why = f"line(s) {lines_} not JSON ({refused[0].detail}); in this format a conversation spans lines"
            return None, [Refused(path, None, "malformed_json", f"{why}: the file is refused whole", body)]
    try:
        return convert_data(data, fmt, path, agent_id, agent_version), refused
    except ImportError_ as exc:
        whole_refusal = Refused(path, None, "schema_invalid", _detail(exc, path), body)
    kind = fmt
    if fmt == "auto":
        try:
            kind = _detect_lines(data)
        except ItemError:
            kind = "auto"
    from vigil.ingest.importers import responses

    if kind not in PER_RECORD or (kind == "openai-responses" and responses.sniff_items(data)):
        return None, [*refused, whole_refusal]
    convs: list[Conversation] = []
    for (n, line), record in zip(numbered, data, strict=True):
        try:
            one = convert_data([record] if kind == "tau-bench" else record, kind, path, agent_id, agent_version)
        except ImportError_ as exc:
            refused.append(Refused(path, n, "schema_invalid", _detail(exc, path, single=True), line))
            continue
        convs.extend(one.conversations)
    refused.sort(key=lambda r: r.line or 0)
    if not convs:
        return None, refused
    return Imported(kind, _specs()[kind].title, convs), refused


PART_BYTES = 64 * 1024 * 1024  # files larger than this, of JSON lines of one record each, are read in parts
PART_LINES = 2000  # lines per part


def read_file_parts(
    path: Path,
    fmt: str = "auto",
    agent_id: str | None = None,
    agent_version: str | None = None,
    *,
    part_bytes: int | None = None,
    part_lines: int | None = None,
) -> Iterator[tuple[Imported | None, list[Refused]]]:
    """What :func:`read_file_partial` reads of ``path``, a part at a time, so that importing a file of
    gigabytes holds one part in memory instead of the whole file and its conversations.

    A file over ``part_bytes`` whose first line is a JSON object on its own, in a format where each line is
    a record (:data:`PER_RECORD`: OpenAI chat, Responses and Anthropic records, τ-bench runs), is read
    ``part_lines`` lines at a time; lines are numbered in the file and refused as
    :func:`read_file_partial` refuses them. The format is the one given, or the one detected in the first
    part, for every part. Any other file (a JSON document, a format whose conversations span lines, a
    first part no format reads) is read whole, in one part. ``part_bytes`` and ``part_lines`` default to
    :data:`PART_BYTES` and :data:`PART_LINES`."""
    part_bytes = PART_BYTES if part_bytes is None else part_bytes
    part_lines = PART_LINES if part_lines is None else part_lines
    try:
        big = path.stat().st_size > part_bytes
    except OSError as exc:
        yield None, [Refused(path, None, "unreadable", str(exc), b"")]
        return
    kind = _per_record_kind(path, fmt, part_bytes, part_lines) if big else None
    if kind is None:
        yield read_file_partial(path, fmt, agent_id, agent_version)
        return
    with path.open("rb") as fh:
        part: list[tuple[int, bytes]] = []
        for n, line in enumerate(fh, 1):
            line = line.rstrip(b"\r\n")
            if line.strip():
                part.append((n, line))
            if len(part) >= part_lines:
                yield _from_lines(path, part, kind, agent_id, agent_version, b"\n".join(b for _, b in part))
                part = []
        if part:
            yield _from_lines(path, part, kind, agent_id, agent_version, b"\n".join(b for _, b in part))


def _per_record_kind(path: Path, fmt: str, part_bytes: int, part_lines: int) -> str | None:
    """The format of a file of JSON lines of one record each, from its first ``part_lines`` lines; None when
    it is not one (its first line is not a JSON object of at most ``part_bytes``, or the format is another)."""
    records: list[Any] = []
    with path.open("rb") as fh:
        while len(records) < part_lines:
            line = fh.readline(part_bytes + 1)  # a document on one line is not read whole to find that out
            if not line:
                break
            if len(line) > part_bytes:
                return None
            if not line.strip():
                continue
            try:
                record = loads_exact(line)
            except orjson.JSONDecodeError:
                if not records:  # a JSON document over several lines
                    return None
                continue
            if not records and not isinstance(record, dict):
                return None
            records.append(record)
    try:
        kind = detect(records) if fmt == "auto" else fmt
    except ItemError:
        return None
    return kind if kind in PER_RECORD else None


def load_file(
    path: Path, fmt: Format = "auto", agent_id: str | None = None, agent_version: str | None = None
) -> Iterator[Conversation]:
    """Yield the conversations in ``path``; raises ImportError_ naming the file and item on bad input."""
    yield from read_file(path, fmt, agent_id, agent_version).conversations
