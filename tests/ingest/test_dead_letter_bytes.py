"""Bad traffic leaves bounded dead letters: grouped per batch and reason, raw bytes capped per batch."""

from __future__ import annotations

import orjson
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.support.app import ADMIN, INGEST, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.ingest.pipeline import Envelope
from vigil.store.models import DeadLetterRow


def _kept(rt) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(rows, raw + detail bytes) of every dead letter stored."""
    with rt.sessions() as s:
        n, raw, detail = s.execute(
            select(func.count(), func.sum(func.length(DeadLetterRow.raw)), func.sum(func.length(DeadLetterRow.detail)))
        ).one()
    return n, (raw or 0) + (detail or 0)


def _bad(i: int) -> bytes:
    if i % 3 == 0:
        return b"{not json " + str(i).encode()
    return orjson.dumps({"conversation_id": f"x{i}", "agent_id": "a", "messages": []})


def test_a_batch_of_bad_messages_becomes_one_letter_per_partition_and_reason(db_url: str) -> None:
    rt = build_runtime(make_settings(db_url, dead_letter_batch_raw_bytes=8192), registry=CollectorRegistry())
    envs = [Envelope(_bad(i), "kafka", "conv", i % 2, i // 2, f"k{i}") for i in range(1000)]
    sent = sum(len(e.raw) for e in envs)
    result = rt.pipeline.process_raw(envs)
    assert len(result.dead_letters) == 1000  # each message is still named (and sent whole to a DLQ topic)
    rows, kept = _kept(rt)
    assert rows == 4 and kept < sent  # 2 partitions × 2 reasons; not 1,000 rows at several times the bytes
    with rt.sessions() as s:
        letters = s.scalars(select(DeadLetterRow).order_by(DeadLetterRow.partition, DeadLetterRow.offset)).all()
        assert sum(len(d.raw) for d in letters) <= 8192
        malformed = next(d for d in letters if d.reason == "malformed_json" and d.partition == 0)
        assert malformed.offset == 0 and malformed.detail.startswith("167 message(s) at offsets 0, 3, 6,")
        assert malformed.raw_size == sum(len(e.raw) for e in envs if e.partition == 0 and e.raw.startswith(b"{n")) + 166
    # a redelivered batch writes nothing new; one that grew (more messages polled) records only the new ones
    rt.pipeline.process_raw(envs)
    assert _kept(rt)[0] == 4
    more = envs + [Envelope(_bad(i), "kafka", "conv", i % 2, i // 2, f"k{i}") for i in range(1000, 1100)]
    rt.pipeline.process_raw(more)
    with rt.sessions() as s:
        first = s.scalars(select(DeadLetterRow).where(DeadLetterRow.partition == 0, DeadLetterRow.offset == 0)).one()
        grown = s.scalars(select(DeadLetterRow).where(DeadLetterRow.partition == 0, DeadLetterRow.offset == 501)).one()
    assert _kept(rt)[0] == 8 and first.detail.startswith("167 message(s)")
    assert grown.reason == "malformed_json" and grown.detail.startswith("17 message(s) at offsets 501, 504,")
    rt.close()


def test_one_request_keeps_at_most_the_batch_cap_of_raw_bytes(db_url: str) -> None:
    rt = build_runtime(
        make_settings(db_url, dead_letter_raw_bytes=4096, dead_letter_batch_raw_bytes=6000),
        registry=CollectorRegistry(),
    )
    bad = [
        {"conversation_id": f"x{i}", "agent_id": "a", "messages": []}
        if i % 2
        else {"conversation_id": f"x{i}", "agent_id": "a", "messages": [{"role": "user", "content": "a"}], "x": 1.5}
        for i in range(1000)
    ]
    body = orjson.dumps(bad).replace(b"1.5", b"NaN")
    with make_client(rt) as c:
        r = c.post("/v1/conversations", content=body, headers=INGEST)
        assert r.status_code == 422 and r.json()["rejected"] == 1000
        dead = c.get("/v1/dead-letters", headers=ADMIN).json()
    assert sorted(d["reason"] for d in dead) == ["non_finite_number", "schema_invalid"]
    rows, kept = _kept(rt)
    with rt.sessions() as s:
        assert (s.scalar(select(func.sum(func.length(DeadLetterRow.raw)))) or 0) <= 6000
    assert rows == 2 and kept < len(body) / 4
    rt.close()


def test_letters_of_messages_summing_past_2_gib_are_stored(db_url: str) -> None:
    """A consumer batch of 40 refused messages of 60 MiB (kept by their first bytes) made one letter whose
    size, 2.4 GiB, overflowed the 32-bit raw_size column: its insert was refused on every try, holding the
    consumer on that batch for good. Such a size is stored as the column's largest value."""
    from vigil.store.writes import DeadLetter

    registry = CollectorRegistry()
    rt = build_runtime(make_settings(db_url), registry=registry)
    letters = [DeadLetter("kafka", "oversized", "60 MiB", b"x" * 100, "conv", 0, o, size=60 << 20) for o in range(40)]
    rt.pipeline.store([], letters, "kafka")
    with rt.sessions() as s:
        [row] = s.scalars(select(DeadLetterRow)).all()
    assert (row.offset, row.last_offset, row.raw_size) == (0, 39, 2**31 - 1)
    assert registry.get_sample_value("vigil_dead_letters_total", {"reason": "oversized", "source": "kafka"}) == 40
