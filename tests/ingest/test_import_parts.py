"""``vigil import`` of a large file of JSON lines reads it a part at a time (``read_file_parts``).

A part is read, stored and dropped before the next is read, so memory holds one part of the file, not the
whole file and every conversation in it. What is read, and what is refused (by line number), is what reading
the file whole gives; files that cannot be read in parts (a JSON document, a format whose conversations
span lines) are read whole as before.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.ingest.test_formats import _flatten, langsmith_run_tree
from tests.support.app import ADMIN, REVIEWER
from tests.support.cli import cli_runner
from vigil.ingest import importers
from vigil.ingest.importers import read_file_partial, read_file_parts


def _chat(i: int) -> bytes:
    return orjson.dumps(
        {
            "conversation_id": f"part-{i}",
            "agent_id": "support-bot",
            "messages": [
                {"role": "user", "content": f"Where is order {i}?"},
                {"role": "assistant", "content": f"Order {i} ships tomorrow."},
            ],
        }
    )


def _lines(tmp_path: Path, n: int = 25, broken: int = 13, wrong: int = 20) -> Path:
    """``n`` OpenAI chat records, one per line, with line ``broken`` not JSON and line ``wrong`` a record
    of the wrong shape (lines counted from 1; a blank line after line 5)."""
    rows: list[bytes] = []
    for i in range(1, n + 1):
        if i == broken:
            rows.append(b'{"conversation_id": "part-broken", "messages": [')
        elif i == wrong:
            rows.append(orjson.dumps({"conversation_id": "part-wrong", "messages": [{"role": "robot"}]}))
        else:
            rows.append(_chat(i))
        if i == 5:
            rows.append(b"   ")
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"\r\n".join(rows) + b"\r\n")
    return path


def _ids(imported: Any) -> list[str]:
    return [c.conversation_id for c in imported.conversations] if imported is not None else []


def test_a_large_file_of_records_is_read_in_parts_as_it_would_be_whole(tmp_path: Path) -> None:
    path = _lines(tmp_path)
    parts = list(read_file_parts(path, part_bytes=1000, part_lines=10))
    assert [len(_ids(imported)) + len(bad) for imported, bad in parts] == [10, 10, 5]
    whole, whole_bad = read_file_partial(path)
    assert whole is not None and {imported.format for imported, _ in parts if imported} == {whole.format}
    assert [i for imported, _ in parts for i in _ids(imported)] == _ids(whole)
    refused = [r for _, bad in parts for r in bad]
    # each refusal names the line of the file (a blank line and CRLF endings counted as the whole read counts)
    assert [(r.line, r.reason) for r in refused] == [(r.line, r.reason) for r in whole_bad]
    assert [(r.line, r.reason) for r in refused] == [(14, "malformed_json"), (21, "schema_invalid")]
    assert refused[0].raw.startswith(b'{"conversation_id": "part-broken"')


def test_a_small_file_and_files_that_cannot_be_split_are_read_whole(tmp_path: Path) -> None:
    path = _lines(tmp_path)
    assert len(list(read_file_parts(path, part_bytes=path.stat().st_size, part_lines=10))) == 1  # not over the size
    # a JSON document, even over several lines
    document = tmp_path / "doc.json"
    document.write_bytes(orjson.dumps([orjson.loads(_chat(i)) for i in range(30)], option=orjson.OPT_INDENT_2))
    [(imported, bad)] = list(read_file_parts(document, part_bytes=1000, part_lines=10))
    assert len(_ids(imported)) == 30 and not bad
    # one line holding the whole document: found out without reading past part_bytes
    one_line = tmp_path / "one-line.json"
    one_line.write_bytes(orjson.dumps([orjson.loads(_chat(i)) for i in range(30)]))
    [(imported, bad)] = list(read_file_parts(one_line, part_bytes=1000, part_lines=10))
    assert len(_ids(imported)) == 30 and not bad
    # a format whose conversations span lines (LangSmith runs): cut into parts, its runs would be orphaned
    runs = tmp_path / "runs.jsonl"
    lines = [orjson.dumps(r) for r in _flatten(orjson.loads(orjson.dumps(langsmith_run_tree())))]
    runs.write_bytes(b"\n".join(lines))
    longest = max(map(len, lines))
    assert runs.stat().st_size > longest + 1 and len(lines) > 1
    parts = list(read_file_parts(runs, part_bytes=longest + 1, part_lines=1))
    assert len(parts) == 1
    whole, _ = read_file_partial(runs)
    assert parts[0][0] is not None and whole is not None
    assert parts[0][0].format == "langsmith" and _ids(parts[0][0]) == _ids(whole)


def test_the_format_given_or_found_in_the_first_part_reads_every_part(tmp_path: Path) -> None:
    path = _lines(tmp_path, broken=0, wrong=0)
    parts = list(read_file_parts(path, "anthropic", part_bytes=1000, part_lines=10))
    assert len(parts) == 3 and {imported.format for imported, _ in parts if imported} == {"anthropic"}
    # a part none of whose lines is JSON is refused line by line, not as the whole file
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join([_chat(1), _chat(2), b"{nope", b"{nope"]))
    parts = list(read_file_parts(bad, part_bytes=200, part_lines=2))
    refused = [(r.line, r.reason) for _, bad_lines in parts for r in bad_lines]
    assert refused == [(3, "malformed_json"), (4, "malformed_json")]
    assert parts[1][0] is None


def test_vigil_import_stores_each_part_before_it_reads_the_next(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy import create_engine, text

    from tests.support.app import make_client, make_settings
    from vigil.app.cli import app
    from vigil.app.runtime import build_runtime

    path = _lines(tmp_path)
    monkeypatch.setattr(importers, "PART_BYTES", 1000)
    monkeypatch.setattr(importers, "PART_LINES", 10)
    engine = create_engine(sqlite_url)
    stored_when_read: list[int] = []
    from_lines = importers._from_lines

    def counting(*args: Any, **kwargs: Any) -> Any:
        with engine.connect() as conn:
            stored_when_read.append(int(conn.execute(text("SELECT count(*) FROM conversations")).scalar_one()))
        return from_lines(*args, **kwargs)

    monkeypatch.setattr(importers, "_from_lines", counting)
    env = {"VIGIL_DATABASE_URL": sqlite_url, "VIGIL_METRICS_PORT": "0"}
    result = cli_runner(env=env).invoke(app, ["import", str(path), "--batch", "4"])
    engine.dispose()
    assert result.exit_code == 2, result.output
    assert stored_when_read == [0, 10, 18], "each part is stored before the next one is read"
    assert f"{path}: openai (detected" in result.output and "23 conversations" in result.output
    assert "stored 23, refused 2:" in result.output
    assert f"line 14 of {path}: not JSON" in result.output and f"line 21 of {path}: messages.0.role" in result.output
    rt = build_runtime(make_settings(sqlite_url))
    with make_client(rt) as c:
        listed = c.get("/v1/conversations", headers=REVIEWER, params={"limit": 100}).json()
        assert len(listed["items"]) == 23
        letters = c.get("/v1/dead-letters", headers=ADMIN).json()
        assert sorted(d["reason"] for d in letters) == ["malformed_json", "schema_invalid"]
        assert {d["source"] for d in letters} == {"replay"}
    rt.close()


@pytest.mark.kafka
def test_vigil_import_to_kafka_in_parts_produces_every_readable_conversation_once(
    tmp_path: Path, kafka: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    from kafka import KafkaConsumer

    from tests.support.services import create_topic
    from vigil.app.cli import app

    path = _lines(tmp_path)
    monkeypatch.setattr(importers, "PART_BYTES", 1000)
    monkeypatch.setattr(importers, "PART_LINES", 10)
    topic = f"import-parts-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1)
    env = {"VIGIL_KAFKA_BOOTSTRAP_SERVERS": kafka, "VIGIL_KAFKA_CONVERSATIONS_TOPIC": topic}
    result = cli_runner(env=env).invoke(app, ["import", "--to-kafka", str(path)])
    assert result.exit_code == 2, result.output
    assert f"produced 23 of 23 conversations to {topic}" in result.output and "produced 23, refused 2:" in result.output
    reader = KafkaConsumer(topic, bootstrap_servers=kafka, auto_offset_reset="earliest", consumer_timeout_ms=8000)
    keys = [m.key.decode() for m in reader]
    reader.close()
    assert sorted(keys) == sorted(f"part-{i}" for i in range(1, 26) if i not in (13, 20))


@pytest.mark.kafka
def test_vigil_import_to_kafka_says_what_the_brokers_did_not_take(
    tmp_path: Path, kafka: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send that fails after the client's retries was not counted and "produced N" was printed anyway."""
    import uuid

    from tests.support.services import create_topic
    from vigil.app.cli import app
    from vigil.ingest import kafka as kafka_module

    path = _lines(tmp_path)
    topic = f"import-undelivered-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1)
    real = kafka_module.kafka_producer
    # records over 300 bytes are refused: the larger conversations of the file fail, the small ones land
    monkeypatch.setattr(kafka_module, "kafka_producer", lambda b, **kw: real(b, **kw, max_request_size=300))
    env = {"VIGIL_KAFKA_BOOTSTRAP_SERVERS": kafka, "VIGIL_KAFKA_CONVERSATIONS_TOPIC": topic}
    result = cli_runner(env=env).invoke(app, ["import", "--to-kafka", str(path)])
    assert result.exit_code == 2, result.output
    found = re.search(r"produced (\d+) of 23 conversations", result.output)
    assert found and int(found.group(1)) < 23, result.output
    failed = 23 - int(found.group(1))
    assert f"{failed} of 23 messages were not delivered to Kafka (first: MessageSizeTooLargeError" in result.output
    assert "Traceback" not in result.output


def test_a_file_that_is_not_json_from_its_first_byte_is_refused_without_reading_it(tmp_path: Path) -> None:
    """A 2 GB sparse file of NUL bytes was read whole (6.5 GB of memory, 29 s) before orjson refused it."""
    from vigil.ingest.importers import read_file_parts

    sparse = tmp_path / "sparse.json"
    with sparse.open("wb") as fh:
        fh.truncate(512 * 1024**2)  # 512 MiB of nothing, on no disk
    [(imported, refused)] = list(read_file_parts(sparse))
    assert imported is None and len(refused) == 1
    assert refused[0].reason == "malformed_json" and "starts with byte 0x00 at offset 0" in refused[0].detail
    (tmp_path / "blank-then-json.jsonl").write_bytes(b"\n\n  " + b'{"messages": []}\n')
    [(_, refused)] = list(read_file_parts(tmp_path / "blank-then-json.jsonl"))
    assert all("starts with byte" not in r.detail for r in refused)  # blank lines first are no reason


def _file(tmp_path: Path, rows: list[bytes], name: str = "mixed.jsonl", prefix: bytes = b"") -> Path:
    path = tmp_path / name
    path.write_bytes(prefix + b"\n".join(rows) + b"\n")
    return path


@pytest.mark.parametrize(
    "odd",
    [b'{"conversation_id": "odd", "messages": "not a list"}', b'{"foo": 1}'],
    ids=["messages-not-a-list", "foreign-object"],
)
def test_one_record_no_format_reads_is_refused_alone_when_the_format_is_detected(tmp_path: Path, odd: bytes) -> None:
    """With --format auto, one record no format reads (its `messages` a string, or an object of another
    kind) made detection fail for the whole file: 'unknown shape', 0 of 10 conversations read, no line
    named; with a line that is not JSON as well, the file was refused as one 'whose conversations span
    lines'. The format most lines are in is the file's; the odd line is refused by its number."""
    rows = [_chat(i) for i in range(10)]
    rows[4] = odd
    rows[7] = b"{not json"
    imported, refused = read_file_partial(_file(tmp_path, rows))
    assert imported is not None and imported.format == "openai"
    assert len(imported.conversations) == 8
    assert [r.line for r in refused] == [5, 8], [str(r) for r in refused]
    assert refused[0].reason == "schema_invalid" and refused[1].reason == "malformed_json"


def test_a_file_mostly_of_records_no_format_reads_is_still_refused_whole(tmp_path: Path) -> None:
    """The majority decides only when more than half the lines are records some format reads."""
    rows = [_chat(0), _chat(1), b'{"foo": 1}', b'{"bar": 2}', b'{"baz": 3}']
    imported, refused = read_file_partial(_file(tmp_path, rows))
    assert imported is None and len(refused) == 1 and refused[0].line is None
    assert "unknown shape" in refused[0].detail


@pytest.mark.parametrize("name", ["bom.jsonl", "bom.json"])
def test_a_utf8_byte_order_mark_is_skipped(tmp_path: Path, name: str) -> None:
    """Windows tools (PowerShell's Out-File, Excel) start files with a UTF-8 byte order mark, which RFC 8259
    lets a reader ignore; the file was refused whole: 'starts with byte 0xef'."""
    rows = [_chat(i) for i in range(3)]
    body = b"[" + b",".join(rows) + b"]" if name.endswith(".json") else b"\r\n".join(rows)
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + body)
    imported, refused = read_file_partial(path)
    assert refused == [] and imported is not None and len(imported.conversations) == 3


def test_a_pipe_is_read_once(tmp_path: Path) -> None:
    """`cat f | vigil import /dev/stdin` said the input was empty, and a FIFO hung: the first bytes were read
    to check the file is JSON, then the whole file was read again from the start, which a pipe cannot do."""
    import os
    import threading

    from tests.support.waiting import scaled

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    body = b"\n".join(_chat(i) for i in range(3)) + b"\n"
    writer = threading.Thread(target=fifo.write_bytes, args=(body,), daemon=True)
    writer.start()
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(read_file_partial(fifo)), daemon=True)
    reader.start()
    reader.join(scaled(60))
    if reader.is_alive():  # opened a second time, with no writer left: it would wait for good
        os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # let it see the end of the input
        pytest.fail("reading the FIFO did not finish: it was opened twice")
    imported, refused = got[0]
    assert refused == [] and imported is not None and len(imported.conversations) == 3
