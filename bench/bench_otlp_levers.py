"""Bounds of two levers on OTLP's cost over native ingest on SQLite (issue 13), measured in process.

    python -m bench.bench_otlp_levers [--copies 4]

Sends the benchmark's interleaved τ² traces (``bench.bench_otlp.interleaved``) to a ``TraceIngest`` as the
HTTP handler calls it (``parse``, then ``ingest``), on SQLite, and prints:

- **validation**: thread CPU per assembled conversation document of what ``TraceIngest._process`` does
  with it (``orjson.dumps`` and the ``Conversation.model_validate`` it runs once, from the dict), beside
  building the same models without validation (``model_construct``, what skipping pydantic for the parts
  Vigil assembles would have to do instead), and the whole ingest's cost per conversation for scale;
- **the request's two commits**: with automatic checkpoints off, the WAL frames (4 KiB pages) each
  transaction wrote, by kind (the spans' transaction, the pipeline's), and how many pages a request's
  pipeline commit wrote again after its spans' commit: what one transaction for both would not write
  twice; and what a commit costs apart from its pages (``sqlite3`` alone, a one-row transaction).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import event

from bench.bench_otlp import _client, conversations, interleaved
from vigil.ingest.otlp import ingest as ingest_module
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.ingest.otlp.otlp import parse
from vigil.schema import INCOMING, Conversation, FunctionCall, Message, ToolCall

PROTOBUF = "application/x-protobuf"


def _per_item(f: Callable[[Any], Any], items: list[Any], reps: int = 7) -> float:
    """Median thread CPU of ``f`` per item, in µs."""
    runs = []
    for _ in range(reps):
        t0 = time.thread_time()
        for item in items:
            f(item)
        runs.append(time.thread_time() - t0)
    return statistics.median(runs) / len(items) * 1e6


def _constructed(doc: dict[str, Any]) -> list[Message]:
    """The document's messages as models built without validation."""
    out = []
    for m in doc["messages"]:
        calls = m.get("tool_calls")
        if calls:
            m = {
                **m,
                "tool_calls": [
                    ToolCall.model_construct(id=c["id"], function=FunctionCall.model_construct(**c["function"]))
                    for c in calls
                ],
            }
        out.append(Message.model_construct(**m))
    return out


def validation(copies: int) -> None:
    convs = conversations(copies)
    bodies = interleaved(convs)
    docs: list[dict[str, Any]] = []
    assemble = ingest_module.assemble

    def kept(*args: Any, **kwargs: Any) -> Any:
        doc = assemble(*args, **kwargs)
        if doc is not None:
            docs.append(doc)
        return doc

    with tempfile.TemporaryDirectory() as tmp:
        _, rt = _client(Path(tmp), "levers")
        traces = TraceIngest(rt)
        ingest_module.assemble = kept  # type: ignore[assignment]
        try:
            t0 = time.thread_time()
            for body in bodies:
                traces.ingest(parse(body, PROTOBUF)[0])
            whole = (time.thread_time() - t0) / len(convs) * 1e6
        finally:
            ingest_module.assemble = assemble
            rt.close()
    print(f"validation, {len(docs)} documents of {len(convs)} conversations (µs per document):")
    print(f"  parse and ingest, all of it: {whole:8.1f}")
    dumps = _per_item(lambda d: orjson.dumps(d).decode(), docs)
    validate = _per_item(lambda d: Conversation.model_validate(d, context=INCOMING), docs)
    print(f"  orjson.dumps and decode:     {dumps:8.1f}")
    print(f"  model_validate (INCOMING):   {validate:8.1f}")
    print(f"  messages model_construct:    {_per_item(_constructed, docs):8.1f}")


def _commits(wal: bytes) -> list[list[int]]:
    """The page numbers of each commit's frames in a WAL file."""
    page_size = struct.unpack(">I", wal[8:12])[0]
    commits: list[list[int]] = []
    pages: list[int] = []
    at = 32
    while at + 24 + page_size <= len(wal):
        page, size_after = struct.unpack(">II", wal[at : at + 8])
        pages.append(page)
        if size_after:  # a commit's last frame
            commits.append(pages)
            pages = []
        at += 24 + page_size
    return commits


def commits(copies: int) -> None:
    convs = conversations(copies)
    bodies = interleaved(convs)
    kinds: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        _, rt = _client(Path(tmp), "wal")
        rt.engine.dispose()

        @event.listens_for(rt.engine, "connect")
        def _no_checkpoints(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA wal_autocheckpoint=0")

        with rt.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        traces = TraceIngest(rt)
        spans_tx, pipeline_tx = traces._transaction, rt.pipeline.process_documents

        def spans(*args: Any, **kwargs: Any) -> Any:
            out = spans_tx(*args, **kwargs)
            kinds.append("spans")
            return out

        def pipeline(*args: Any, **kwargs: Any) -> Any:
            out = pipeline_tx(*args, **kwargs)
            kinds.append("pipeline")
            return out

        traces._transaction = spans  # type: ignore[method-assign]
        rt.pipeline.process_documents = pipeline  # type: ignore[method-assign]
        for body in bodies:
            traces.ingest(parse(body, PROTOBUF)[0])
        found = _commits((Path(tmp) / "wal.db-wal").read_bytes())
        rt.close()
    assert len(found) == len(kinds), (len(found), kinds)
    n = len(convs)
    frames = {k: sum(len(c) for c, kind in zip(found, kinds, strict=True) if kind == k) for k in ("spans", "pipeline")}
    again = sum(
        len(set(found[i]) & set(found[i + 1]))
        for i in range(len(found) - 1)
        if kinds[i] == "spans" and kinds[i + 1] == "pipeline"
    )
    print(f"commits, {n} conversations, {len(bodies)} requests: {len(found)} commits")
    spans_frames, pipeline_frames = frames["spans"] / n, frames["pipeline"] / n
    print(f"  frames per conversation: spans' transactions {spans_frames:.2f}, pipeline's {pipeline_frames:.2f}")
    print(f"  pages a request's pipeline commit wrote again after its spans' commit: {again / n:.2f} per conversation")
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp) / "x.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        db.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * 100) for i in range(100_000)])
        for rows in (1, 10):

            def tx(i: int, rows: int = rows) -> None:
                db.execute("BEGIN")
                for r in range(rows):
                    db.execute("UPDATE t SET v = ? WHERE k = ?", ("y" * 100, (i * 7919 + r * 3001) % 100_000))
                db.execute("COMMIT")

            cost = _per_item(tx, list(range(200)))
            print(f"  a transaction updating {rows:2d} row(s) on pages of their own: {cost:6.1f} µs")
        db.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=4, help="copies of the 120 τ² conversations")
    args = ap.parse_args(argv)
    validation(args.copies)
    commits(args.copies)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
