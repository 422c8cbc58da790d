"""Record batches as `vigil consume` reads them: one that cannot be read is refused, not raised.

kafka-python turns a fetched batch it cannot read (a codec whose library is missing, a compressed payload
that does not decompress, a failed checksum) into an exception out of ``poll()``. `vigil consume` stopped
on it, and again after every restart, as the group's offset still pointed at the batch; a consumer that
polled again instead spun in the fetcher at full CPU, holding its partitions. Here such a batch becomes one
record whose value is a :class:`Refused` in place of its messages: the worker keeps it as a dead letter
(its compressed bytes, first and last offset) and the partition goes on after it.

This extends kafka-python's fetcher (``Fetcher.PartitionRecords`` and ``MemoryRecords``, which are not
its public API): :func:`guard` raises :class:`GuardUnavailable` when they are not as expected, and
pyproject keeps kafka-python below 3.1.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


class GuardUnavailable(Exception):
    """The installed kafka-python's fetcher is not the one :func:`guard` extends."""


@dataclass(frozen=True, slots=True)
class Refused:
    """What the consumer keeps of messages it cannot hand to a topic's handler: a dead letter's facts."""

    reason: str
    detail: str
    raw: bytes
    first_offset: int
    last_offset: int
    messages: int


def guard(consumer: Any) -> None:
    """Make ``consumer`` (a KafkaConsumer) hand over a batch it cannot read as a :class:`Refused` record."""
    from kafka.record.memory_records import MemoryRecords

    fetcher = getattr(consumer, "_fetcher", None)
    base = getattr(fetcher, "PartitionRecords", None)
    if base is None or not hasattr(base, "_unpack_records") or not hasattr(MemoryRecords, "_buffer"):
        raise GuardUnavailable("kafka-python's fetcher has no PartitionRecords._unpack_records to extend")
    fetcher.PartitionRecords = _guarded(base)  # type: ignore[union-attr]


def _guarded(base: type) -> type:
    from kafka.consumer.fetcher import ConsumerRecord
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.memory_records import MemoryRecords

    class Batches(MemoryRecords):  # type: ignore[misc]
        """The fetched bytes of one partition, batch by batch, remembering the batch being read and its bytes."""

        __slots__ = ("current",)

        def __init__(self, data: Any) -> None:
            self.current: tuple[Any, bytes] | None = None
            super().__init__(data)

        def next_batch(self, *args: Any) -> Any:
            self.current = None  # a batch too short to be one raises here, and is not refused
            raw = self._next_slice
            batch = super().next_batch(*args)
            if batch is not None:
                self.current = (batch, bytes(raw))
            return batch

    class GuardedRecords(base):  # type: ignore[valid-type,misc]
        def __init__(self, fetch_offset: int, tp: Any, records: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(fetch_offset, tp, Batches(records._buffer), *args, **kwargs)

        def _unpack_records(self, tp: Any, records: Any, *args: Any) -> Iterator[Any]:
            while True:  # read on after a refused batch with the same records, from the batch after it
                try:
                    yield from super()._unpack_records(tp, records, *args)
                    return
                except Exception as exc:
                    current, records.current = records.current, None
                    if current is None or not isinstance(current[0], DefaultRecordBatch):
                        raise  # not within a batch of message format 2: as kafka-python has it
                    batch, raw = current
                    state: Any = self  # kafka-python's PartitionRecords: where the next fetch starts
                    first = max(state.next_fetch_offset, batch.base_offset)
                    state.next_fetch_offset = batch.next_offset  # the next batch, whatever this one held
                    refused = _unreadable(tp, batch, raw, first, exc)
                    yield ConsumerRecord(
                        tp.topic, tp.partition, state.leader_epoch, batch.last_offset, batch.max_timestamp,
                        batch.timestamp_type, None, refused, [], None, -1, len(raw), -1,
                    )  # fmt: skip

    GuardedRecords.__name__ = GuardedRecords.__qualname__ = "GuardedPartitionRecords"
    return GuardedRecords


def _unreadable(tp: Any, batch: Any, raw: bytes, first: int, exc: Exception) -> Refused:
    codec = CODECS.get(batch.compression_type, str(batch.compression_type))
    last = batch.last_offset
    messages = batch.records_count if first <= batch.base_offset else max(1, last - first + 1)
    detail = (
        f"a record batch ({codec}, {len(raw)} bytes, offsets {first}-{last}, {messages} message(s)) could not be "
        f"read: {type(exc).__name__}: {exc}"
    )
    log.warning("%s partition %d: %s", tp.topic, tp.partition, detail)
    return Refused("undecodable_batch", detail, raw, first, last, messages)
