"""Record batches as `vigil consume` reads them: bounded as they inflate, and refused, not raised, when
they cannot be read.

kafka-python turns a fetched batch it cannot read (a codec whose library is missing, a compressed payload
that does not decompress, a failed checksum) into an exception out of ``poll()``. `vigil consume` stopped
on it, and again after every restart, as the group's offset still pointed at the batch; a consumer that
polled again instead spun in the fetcher at full CPU, holding its partitions. Here such a batch becomes one
record whose value is a :class:`Refused` in place of its messages: the worker keeps it as a dead letter
(its compressed bytes, first and last offset) and the partition goes on after it.

kafka-python inflated a compressed batch whole, however large: a zstd batch of 32 KB inflating to 1 GiB
took the consumer from 234 MB to 3.4 GB (the inflated bytes, copied once more), and a batch the broker
takes at 1 MB can inflate to some 30 GiB. Here a batch inflates in steps and stops past
``VIGIL_KAFKA_MAX_INFLATED_BATCH_BYTES``: it is refused (``oversized_batch``) with its compressed bytes.
A message larger than ``VIGIL_MAX_MESSAGE_BYTES`` is refused as it leaves its batch (``oversized``, with its
first :data:`KEEP_BYTES`), so many small batches of large messages cannot fill the consumer either: a
poll holds at most ``VIGIL_KAFKA_BATCH_SIZE`` messages of that size, besides the batch being read.
(Batches of the message formats before Kafka 0.11, which no current client writes, are not bounded.)

This extends kafka-python's fetcher (``Fetcher.PartitionRecords`` and ``MemoryRecords``, which are not
its public API): :func:`guard` raises :class:`GuardUnavailable` when they are not as expected, and
pyproject keeps kafka-python below 3.1.
"""

from __future__ import annotations

import gzip
import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
BATCH_REASONS = ("undecodable_batch", "oversized_batch")  # a whole batch's; a handler refuses messages for others
KEEP_BYTES = 512 * 1024  # of a refused message's bytes, for its dead letter (and the dead-letter topic)
STEP = 1 << 20  # bytes inflated at a time


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
    size: int  # of what was refused, of which ``raw`` may be the first bytes only


class BatchTooLarge(Exception):
    """A compressed batch inflates past the bound; inflating stopped there."""


def guard(consumer: Any, max_inflated_bytes: int, max_message_bytes: int) -> None:
    """Make ``consumer`` (a KafkaConsumer) inflate no batch past ``max_inflated_bytes``, and hand over a batch
    it cannot read, or a message larger than ``max_message_bytes``, as a :class:`Refused` record."""
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.memory_records import MemoryRecords

    fetcher = getattr(consumer, "_fetcher", None)
    base = getattr(fetcher, "PartitionRecords", None)
    if (
        base is None
        or not hasattr(base, "_unpack_records")
        or not {"_buffer", "_next_slice"} <= set(MemoryRecords.__slots__)
        or not {"_buffer", "_pos", "_decompressed"} <= set(DefaultRecordBatch.__slots__)
        or not hasattr(DefaultRecordBatch, "_maybe_uncompress")
    ):
        raise GuardUnavailable("kafka-python's fetcher and record batches are not the ones Vigil extends")
    fetcher.PartitionRecords = _guarded(base, max_inflated_bytes, max_message_bytes)  # type: ignore[union-attr]


def inflate(codec: int, data: memoryview, limit: int) -> bytearray:
    """The batch payload ``data`` in ``codec`` (Kafka's numbers), decompressed; :class:`BatchTooLarge` as soon
    as it is found to exceed ``limit`` bytes, having held at most that many."""
    if codec == 1:
        return _read_within(gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb"), limit)
    if codec == 2:
        return _snappy(data.tobytes(), limit)
    if codec == 3:
        return _lz4(data.tobytes(), limit)
    if codec == 4:
        import zstandard

        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
            return _read_within(reader, limit)
    raise ValueError(f"unknown compression codec {codec}")


def _read_within(reader: Any, limit: int) -> bytearray:
    out = bytearray()
    while True:
        chunk = reader.read(min(STEP, limit + 1 - len(out)))
        if not chunk:
            return out
        out += chunk
        if len(out) > limit:
            raise BatchTooLarge(limit)


def _lz4(data: bytes, limit: int) -> bytearray:
    import lz4.frame

    d = lz4.frame.LZ4FrameDecompressor()
    out = bytearray(d.decompress(data, max_length=min(STEP, limit + 1)))
    while not d.eof and len(out) <= limit:
        chunk = d.decompress(b"", max_length=min(STEP, limit + 1 - len(out)))
        if not chunk and d.needs_input:
            raise ValueError("lz4 frame ends early")
        out += chunk
    if len(out) > limit:
        raise BatchTooLarge(limit)
    return out


def _snappy(data: bytes, limit: int) -> bytearray:
    """Snappy states each block's inflated length before it: the sum is checked before anything inflates."""
    from kafka.codec import snappy_decode

    blocks = []
    if data[:8] == b"\x82SNAPPY\x00":  # the framing Java clients write: 16 bytes, then sized blocks
        pos = 16
        while pos + 4 <= len(data):
            size = int.from_bytes(data[pos : pos + 4], "big")
            blocks.append(pos + 4)
            pos += 4 + size
    else:
        blocks.append(0)
    declared = 0
    for start in blocks:
        length, shift, pos = 0, 0, start
        while pos < len(data) and shift < 35:  # the block's inflated length, a varint
            byte = data[pos]
            length |= (byte & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if byte < 0x80:
                break
        declared += length
        if declared > limit:
            raise BatchTooLarge(limit)
    return bytearray(snappy_decode(data))


def _guarded(base: type, max_inflated_bytes: int, max_message_bytes: int) -> type:
    from kafka.consumer.fetcher import ConsumerRecord
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.memory_records import MemoryRecords

    class BoundedBatch(DefaultRecordBatch):  # type: ignore[misc]
        """A batch of message format 2 that inflates within ``max_inflated_bytes``."""

        __slots__ = ()

        def _maybe_uncompress(self) -> None:  # kafka-python's, with a bound
            batch: Any = self  # its state: the buffer, where the records start, whether inflated
            if not batch._decompressed:
                codec = batch.compression_type
                if codec != batch.CODEC_NONE:
                    batch._assert_has_codec(codec)  # a missing library, as kafka-python says it
                    batch._buffer = inflate(codec, memoryview(batch._buffer)[batch._pos :], max_inflated_bytes)
                    batch._pos = 0
            batch._decompressed = True

    class Batches(MemoryRecords):  # type: ignore[misc]
        """The fetched bytes of one partition, batch by batch, remembering the batch being read and its bytes."""

        __slots__ = ("current",)

        def __init__(self, data: Any) -> None:
            self.current: tuple[Any, memoryview] | None = None
            super().__init__(data)

        def next_batch(self, *args: Any) -> Any:
            self.current = None  # a batch too short to be one raises here, and is not refused
            raw = self._next_slice
            batch = super().next_batch(*args)
            if isinstance(batch, DefaultRecordBatch):
                batch = BoundedBatch(raw)
            if batch is not None:
                self.current = (batch, raw)
            return batch

    class GuardedRecords(base):  # type: ignore[valid-type,misc]
        def __init__(self, fetch_offset: int, tp: Any, records: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(fetch_offset, tp, Batches(records._buffer), *args, **kwargs)

        def _unpack_records(self, tp: Any, records: Any, *args: Any) -> Iterator[Any]:
            while True:  # read on after a refused batch with the same records, from the batch after it
                try:
                    for record in super()._unpack_records(tp, records, *args):
                        if record.value is not None and len(record.value) > max_message_bytes:
                            record = record._replace(value=_oversized(record, max_message_bytes))
                        yield record
                    return
                except Exception as exc:
                    current, records.current = records.current, None
                    if current is None or not isinstance(current[0], DefaultRecordBatch):
                        raise  # not within a batch of message format 2: as kafka-python has it
                    batch, raw = current
                    state: Any = self  # kafka-python's PartitionRecords: where the next fetch starts
                    first = max(state.next_fetch_offset, batch.base_offset)
                    state.next_fetch_offset = batch.next_offset  # the next batch, whatever this one held
                    refused = _unreadable(tp, batch, bytes(raw), first, exc)
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
    what = f"a record batch ({codec}, {len(raw)} bytes, offsets {first}-{last}, {messages} message(s))"
    if isinstance(exc, BatchTooLarge):
        reason = "oversized_batch"
        detail = (
            f"{what} inflates to more than {exc.args[0]} bytes (VIGIL_KAFKA_MAX_INFLATED_BATCH_BYTES); it was "
            "not inflated further"
        )
    else:
        reason, detail = "undecodable_batch", f"{what} could not be read: {type(exc).__name__}: {exc}"
    log.warning("%s partition %d: %s", tp.topic, tp.partition, detail)
    return Refused(reason, detail, raw, first, last, messages, len(raw))


def _oversized(record: Any, limit: int) -> Refused:
    size = len(record.value)
    detail = f"{size} bytes exceeds the limit of {limit} (VIGIL_MAX_MESSAGE_BYTES)"
    return Refused("oversized", detail, bytes(record.value[:KEEP_BYTES]), record.offset, record.offset, 1, size)
