"""Stores what the spans of one conversation repeat only once.

Each inference span usually resends the whole history: its ``gen_ai.input.messages`` (and the like)
is the previous span's plus the new turns. Stored as is, a conversation's spans grow with the square of
its length. Before a span is stored, a long string attribute equal to the same attribute of an earlier
span of the same conversation (in the same request, or one this process stored before) becomes
``{"$same": BASE}``, and one extending it (a JSON list with items appended)
``{"$ext": BASE, "n": CHARS, "rest": TAIL}``, BASE being that span's id and ``"t"`` its trace (span ids
are unique only within a trace; ``""``: the referring span's own). An extension that starts with the
items of another long list attribute of its base (the history resends the previous span's output first)
names it instead of repeating it: ``{"$ext": BASE, "n": CHARS, "out": ATTRIBUTE, "rest": TAIL}`` is
``base[:CHARS] + "," + output[1:-1] + TAIL``. A value the exporter sent that looks like a reference (a
key-value list with a ``$`` key those use) is stored as ``{"$lit": VALUE}``, so it reads back as sent.
:func:`expand` restores the values when the spans are read back (in start order, so a base comes
first); a reference without ``"t"`` (stored before references named their trace) means the latest
earlier span of that id, as it did. A conversation's spans are deleted together, so a base outlives the
spans referring to it.
"""

from __future__ import annotations

from typing import Any

from vigil.ingest.otlp.otlp import EXTENDS

MIN_CHARS = 256  # shorter values are not worth a reference
MARKERS = frozenset(("$same", "$ext", "$val", "$lit"))
_NONE: dict[str, str] = {}


def _looks_like_ref(v: Any) -> bool:
    return v.__class__ is dict and not MARKERS.isdisjoint(v)


def literal(span: dict[str, Any]) -> dict[str, Any]:
    """The span with each value the exporter sent that looks like a reference kept as ``{"$lit": value}``:
    what :func:`compact` does, for a span stored whole."""
    attrs = span["attributes"]
    if not any(_looks_like_ref(v) for v in attrs.values()):
        return span
    return {**span, "attributes": {k: {"$lit": v} if _looks_like_ref(v) else v for k, v in attrs.items()}}


def _key(span: dict[str, Any]) -> tuple[int, int, str]:
    return (span["start_ns"], span["end_ns"], span["span_id"])


# attribute -> (start key, span id, trace id, value) of the latest span carrying it
Last = dict[str, tuple[tuple[int, int, str], str, str, str]]


def compact(spans: list[dict[str, Any]], last: Last | None = None) -> tuple[list[dict[str, Any]], Last]:
    """Spans of one conversation with repeated long attribute values replaced by references, to earlier
    spans of the list or to the (stored) spans ``last`` describes; and ``last`` after these spans.

    A value equal to its base is replaced in ``spans`` too by the base's string (the same text), so
    whoever reads the spans next compares them by identity instead of character by character."""
    out: list[dict[str, Any]] = []
    last = dict(last or {})
    for span in sorted(spans, key=_key):
        attrs = span["attributes"]
        refs: dict[str, Any] = {}
        at = _key(span)
        before = dict(last)  # the base's other values, before this span's own replace them
        sid, trace = span["span_id"], span.get("trace_id", "")
        extends = span.get(EXTENDS) or _NONE
        for k, v in attrs.items():
            if v.__class__ is not str:  # decoded values are plain str (a subclass is no value of theirs)
                if v.__class__ is dict and not MARKERS.isdisjoint(v):
                    refs[k] = {"$lit": v}  # sent so: not to be read as a reference
                continue
            if len(v) < MIN_CHARS:
                continue
            prev = last.get(k)
            last[k] = (at, sid, trace, v)
            if prev is None or prev[0] > at or (prev[1] == sid and prev[2] == trace):
                continue  # a base must come first in start order (see expand), and be another span
            _, base, base_trace, pv = prev
            n = len(pv) - 1
            if v is pv or v == pv:
                refs[k] = {"$same": base}
                attrs[k] = pv  # one string for both: later identity checks (see InputCache) are free
                last[k] = (at, sid, trace, pv)
            elif extends.get(k) is pv or (len(v) > n and v[n] == "," and pv.endswith("]") and v.startswith(pv[:-1])):
                # parse found it extends this very string (see EXTENDS), or it does so here
                refs[k] = _extension(before, k, base, base_trace, n, v[n:])
            else:
                continue
            refs[k]["t"] = base_trace if base_trace != trace else ""
        out.append({**span, "attributes": {**attrs, **refs}} if refs else span)
    return out, last


def _extension(before: Last, key: str, base: str, trace: str, n: int, rest: str) -> dict[str, Any]:
    for other, (_, sid, t, value) in before.items():
        if other == key or sid != base or t != trace or value[:1] != "[" or value[-1:] != "]":
            continue
        end = len(value) - 1  # "," then the output's items: rest[1:end]
        if end > 1 and rest[end : end + 1] in (",", "]") and rest.startswith(value[1:-1], 1):
            return {"$ext": base, "n": n, "out": other, "rest": rest[end:]}
    return {"$ext": base, "n": n, "rest": rest}


def referenced(span: dict[str, Any]) -> set[tuple[str, str]]:
    """The (trace id, span id) of each span a compacted span's values refer to."""
    out = set()
    for v in span["attributes"].values():
        if isinstance(v, dict) and ("$same" in v or "$ext" in v):
            out.add((v.get("t") or span.get("trace_id", ""), v.get("$same") or v.get("$ext") or ""))
    return out


def expand(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spans as received (stored with :func:`compact`); a value whose base span is gone is dropped.

    A reference names its base by trace and span id; one stored before references carried the trace
    names the latest earlier span of that id, whatever its trace (what it meant when it was written)."""
    resolved: dict[tuple[str, str], dict[str, Any]] = {}
    by_span: dict[str, dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    for span in sorted(spans, key=_key):
        attrs = span["attributes"]
        if any(isinstance(v, dict) and ("$same" in v or "$ext" in v or "$lit" in v) for v in attrs.values()):
            full = dict(attrs)
            for k, v in attrs.items():
                if not isinstance(v, dict):
                    continue
                if "$lit" in v:
                    full[k] = v["$lit"]
                    continue
                sid = v.get("$same") or v.get("$ext") or ""
                # "t": by trace and span id; none (stored before): the latest earlier span of that id
                of = resolved.get((v["t"] or span.get("trace_id", ""), sid)) if "t" in v else by_span.get(sid)
                base = (of or {}).get(k)
                if "$same" in v:
                    full[k] = base
                elif "$ext" in v and "out" in v:
                    output = (of or {}).get(v["out"])
                    if isinstance(base, str) and isinstance(output, str):
                        full[k] = base[: v["n"]] + "," + output[1:-1] + v["rest"]
                    else:
                        full[k] = None
                elif "$ext" in v:
                    full[k] = base[: v["n"]] + v["rest"] if isinstance(base, str) else None
                if full[k] is None:
                    del full[k]
            span = {**span, "attributes": full}
        resolved[(span.get("trace_id", ""), span["span_id"])] = by_span[span["span_id"]] = span["attributes"]
        out.append(span)
    return out
