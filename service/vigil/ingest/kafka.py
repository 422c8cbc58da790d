"""Kafka source: a consumer-group worker that stores each batch before committing its offsets.

Delivery is at-least-once; idempotent writes make a redelivered message change nothing. A message
that cannot be decoded becomes a dead letter (and optionally goes to a dead-letter topic): it never
stops the consumer. A database error stops progress, not the process: the same batch is retried
with backoff, and offsets stay where they were until it is stored.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from vigil.errors import VigilError, without_frames
from vigil.ingest.kafka_batches import BATCH_REASONS, KEEP_BYTES, GuardUnavailable, Refused, guard
from vigil.ingest.pipeline import Envelope
from vigil.runtime import Runtime
from vigil.settings import Settings
from vigil.store.db import db_detail
from vigil.store.writes import DeadLetter

log = logging.getLogger(__name__)

Handler = Callable[[Sequence[Envelope]], Any]


class ConsumerError(VigilError):
    """The consumer could not be set up (no bootstrap servers, unreachable broker)."""


def kafka_consumer(runtime: Runtime, topics: list[str], client_id: str | None = None, **overrides: Any):  # type: ignore[no-untyped-def]
    from kafka import KafkaConsumer

    s = runtime.settings
    if not s.kafka_bootstrap_servers:
        raise ConsumerError("VIGIL_KAFKA_BOOTSTRAP_SERVERS is not set")
    params: dict[str, Any] = dict(
        bootstrap_servers=s.kafka_bootstrap_servers.split(","),
        group_id=s.kafka_group_id,
        client_id=client_id or f"vigil-{s.kafka_group_id}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=s.kafka_batch_size,
        max_poll_interval_ms=s.kafka_max_poll_interval_ms,
        session_timeout_ms=s.kafka_session_timeout_ms,
        heartbeat_interval_ms=max(1000, s.kafka_session_timeout_ms // 3),
        request_timeout_ms=s.kafka_request_timeout_ms,
        bootstrap_timeout_ms=s.kafka_bootstrap_timeout_ms,
        metadata_max_age_ms=s.kafka_metadata_max_age_ms,
        isolation_level=s.kafka_isolation_level,
    )
    params.update(overrides)
    from kafka.errors import KafkaError

    try:
        consumer = KafkaConsumer(**params)
    except KafkaError as exc:
        raise ConsumerError(f"cannot reach Kafka at {s.kafka_bootstrap_servers}: {exc}") from None
    try:
        # batches inflate within a bound; one it cannot read becomes a dead letter, not an exception out of poll()
        guard(consumer, s.kafka_max_inflated_batch_bytes, s.max_message_bytes)
    except GuardUnavailable as exc:
        consumer.close()
        raise ConsumerError(f"this kafka-python cannot be used (Vigil needs kafka-python 3.0.x): {exc}") from None
    consumer.subscribe(topics)
    return consumer


def kafka_producer(bootstrap: str, **overrides: Any):  # type: ignore[no-untyped-def]
    from kafka import KafkaProducer

    params: dict[str, Any] = dict(
        bootstrap_servers=bootstrap.split(","),
        acks="all",
        linger_ms=5,
        retries=5,
        max_request_size=8 * 1024 * 1024,
    )
    params.update(overrides)
    return KafkaProducer(**params)


def dead_letter_producer(runtime: Runtime):  # type: ignore[no-untyped-def]
    """The producer of ``VIGIL_KAFKA_DEAD_LETTER_TOPIC`` (None without one). It reaches for the brokers
    as it is made: an unreachable one is a :class:`ConsumerError` within ``VIGIL_KAFKA_BOOTSTRAP_TIMEOUT_MS``,
    as the consumer's is, not a traceback after kafka-python's own 30 s."""
    if not runtime.settings.kafka_dead_letter_topic:
        return None
    return settings_producer(runtime.settings)


def settings_producer(s: Settings):  # type: ignore[no-untyped-def]
    """A producer to ``VIGIL_KAFKA_BOOTSTRAP_SERVERS`` (the dead-letter topic, ``--to-kafka``): an unreachable
    broker is a :class:`ConsumerError` within ``VIGIL_KAFKA_BOOTSTRAP_TIMEOUT_MS``."""
    from kafka.errors import KafkaError

    if not s.kafka_bootstrap_servers:
        raise ConsumerError("VIGIL_KAFKA_BOOTSTRAP_SERVERS is not set")
    try:
        return kafka_producer(s.kafka_bootstrap_servers, bootstrap_timeout_ms=s.kafka_bootstrap_timeout_ms)
    except KafkaError as exc:
        raise ConsumerError(f"cannot reach Kafka at {s.kafka_bootstrap_servers}: {exc}") from None


class CountedProducer:
    """A ``--to-kafka`` producer that counts what the brokers acknowledged: ``vigil replay`` printed
    "produced N" for sends that never landed, and a flush that gave up ended in a traceback. After a flush,
    every send not acknowledged failed (its own error, the flush's timeout, or the close that dropped it);
    only the acknowledgements are counted, by the client's I/O thread alone, so nothing is counted twice."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.sent = self.acked = 0
        self.first_error: str | None = None

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        self.sent += 1
        try:
            future = self.producer.send(topic, key=key, value=value)
        except Exception as exc:  # refused before it was queued (too large, no metadata in time)
            self._failed(exc)
            return
        future.add_callback(self._acked)
        future.add_errback(self._failed)

    def _acked(self, _metadata: Any) -> None:
        self.acked += 1

    def _failed(self, exc: BaseException) -> None:
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"

    def flush(self, timeout: float) -> None:
        """Wait for every send; what the client cannot deliver in ``timeout`` is not acknowledged."""
        from kafka.errors import KafkaError

        try:
            self.producer.flush(timeout=timeout)
        except KafkaError as exc:
            self._failed(exc)

    def close(self) -> None:
        from kafka.errors import KafkaError

        with contextlib.suppress(KafkaError):
            self.producer.close(timeout=5)

    def problem(self) -> str | None:
        """What went wrong, in one line (None when every send was acknowledged); read after :meth:`flush`."""
        failed = self.sent - self.acked
        if not failed:
            return None
        return f"{failed} of {self.sent} messages were not delivered to Kafka (first: {self.first_error})"


DLQ_VALUE_BYTES = KEEP_BYTES  # of a bad message's bytes produced to the dead-letter topic (brokers take 1 MB)
# An idle consumer asks the brokers for its partitions' end offsets this often: its lag stays current, and an
# answer shows the brokers can be reached (an empty poll does not tell a quiet topic from an unreachable broker).
BROKER_PROBE_SECONDS = 10.0


class ConsumerWorker:
    def __init__(
        self,
        runtime: Runtime,
        consumer: Any,
        handlers: dict[str, Handler] | None = None,
        dead_letter_producer: Any = None,
    ) -> None:
        self.runtime = runtime
        # made with the worker, so a consumer that never reaches its loop (a broker client that hangs being built)
        # stalls /healthz of its metrics port too
        self.heartbeat = runtime.heartbeat("consumer")
        self.consumer = consumer
        s = runtime.settings
        # conversations stay with this worker; other stages add theirs. Whatever a handler returns with
        # ``dead_letters`` (the pipeline's BatchResult, the outcomes' OutcomeBatch) also goes to the topic.
        self.handlers: dict[str, Handler] = handlers or {
            s.kafka_conversations_topic: runtime.pipeline.process_raw,
            **runtime.hooks.topic_handlers,
        }
        self.dlq_producer = dead_letter_producer
        self.stopping = threading.Event()
        self.stored_batches = 0
        self._lag_partitions: set[tuple[str, int]] = set()
        # The offset committed on each assigned partition as far as this worker knows: lag counts from it,
        # not from the fetch position, so a batch polled and not yet stored still counts as lag.
        self._committed: dict[Any, int] = {}
        self._pending: dict[Any, int] = {}  # the next offset of each partition once the polled batch commits
        self._probed_at = 0.0

    def _publish_dead_letters(self, letters: Sequence[Any]) -> None:
        """Also produce the batch's dead letters to the dead-letter topic, as a courtesy: they are stored
        already (with the batch), so a letter the producer or broker refuses (a message over the broker's
        size limit, a broker away) is counted under ``vigil_ingest_errors_total{stage="dead_letter_topic"}``
        and logged, and never makes the batch be stored again or holds up its offsets."""
        topic = self.runtime.settings.kafka_dead_letter_topic
        futures, failed = [], 0
        for d in letters:
            value = d.raw[:DLQ_VALUE_BYTES]
            headers = [
                ("vigil-reason", d.reason.encode()),
                ("vigil-source-topic", (d.topic or "").encode()),
                ("vigil-source-partition", str(d.partition).encode()),
                ("vigil-source-offset", str(d.offset).encode()),
                ("vigil-raw-size", str(d.raw_size).encode()),
            ]
            if len(value) < d.raw_size:
                headers.append(("vigil-truncated", b"true"))
            try:
                key = (d.key or "").encode("utf-8", "replace") or None
                futures.append(self.dlq_producer.send(topic, value=value, key=key, headers=headers))
            except Exception as exc:  # refused before sending: too large, serialisation, producer closed
                failed += 1
                log.warning("producing a dead letter to %s failed: %s", topic, exc)
        try:
            self.dlq_producer.flush(timeout=30)
        except Exception as exc:  # a broker away: what did not go out is counted below
            log.warning("flushing dead letters to %s failed: %s", topic, exc)
        for f in futures:
            if not f.is_done or f.failed():
                failed += 1
                log.warning("producing a dead letter to %s failed: %s", topic, getattr(f, "exception", None))
        if failed:
            self.runtime.metrics.ingest_errors.labels("dead_letter_topic").inc(failed)

    def stop(self) -> None:
        self.stopping.set()
        self.runtime.pipeline.stopping.set()  # a write failing meanwhile gives up at once: nothing is committed

    def run(self, max_idle_polls: int | None = None) -> None:
        """Poll, process, commit until :meth:`stop` (or ``max_idle_polls`` empty polls in a row).

        Polls made while the group is still assigning partitions do not count as idle: joining can
        take up to the rebalance timeout, and a batch job must not give up before it has begun.
        Every poll, empty or not, beats the consumer loop's heartbeat (``/healthz`` of the metrics port).
        """
        s = self.runtime.settings
        heartbeat = self.heartbeat
        idle = 0
        # but never wait for an assignment longer than the rebalance timeout allows, several times over
        unassigned_budget = 4 * s.kafka_max_poll_interval_ms // max(1, s.kafka_poll_timeout_ms) + 10
        try:
            self._broker_answered()  # the client reached the brokers to be built
            with heartbeat.loop():
                while not self.stopping.is_set():
                    heartbeat.beat()  # the iteration before finished (the first: the loop began)
                    records = self.consumer.poll(timeout_ms=s.kafka_poll_timeout_ms, max_records=s.kafka_batch_size)
                    self._polled(records)
                    if records:
                        self._broker_answered()
                    else:
                        self._commit_passed()
                    self._update_lag(fetch_ends=not records and self._probe_due())
                    if not records:
                        if self.consumer.assignment() or unassigned_budget <= 0:
                            idle += 1
                        else:
                            unassigned_budget -= 1
                        if max_idle_polls is not None and idle >= max_idle_polls:
                            return
                        continue
                    idle = 0
                    if not self._handle(records):
                        return
                    self._commit()
        finally:
            self._close()

    def _handle(self, records: dict[Any, list[Any]]) -> bool:
        by_topic: dict[str, list[Envelope]] = {}
        refused: list[DeadLetter] = []  # batches that could not be read, from any topic
        for tp, msgs in records.items():
            bucket = by_topic.setdefault(tp.topic, [])
            for m in msgs:
                key = m.key.decode("utf-8", "replace") if isinstance(m.key, bytes) else m.key
                r = m.value
                if isinstance(r, Refused) and r.reason in BATCH_REASONS:  # a letter of its own: no handler's reason
                    where = (tp.topic, tp.partition, r.first_offset, key, r.messages, r.last_offset, r.size)
                    refused.append(DeadLetter("kafka", r.reason, r.detail, r.raw, *where))
                    continue
                if isinstance(r, Refused):  # one message: its handler keeps it, with its others of that reason
                    envelope = Envelope(
                        r.raw, "kafka", tp.topic, tp.partition, m.offset, key, (r.reason, r.detail, r.size)
                    )
                else:
                    value, why = unframed(r if r is not None else b"")
                    refusal = None if why is None else ("malformed_json", why, len(value))
                    envelope = Envelope(value, "kafka", tp.topic, tp.partition, m.offset, key, refusal)
                bucket.append(envelope)
        # the batches' letters apart: their reasons are no handler's, and each spans its own batch's offsets only
        letters: list[Any] = []
        if refused and not self._with_retry(self._store_refused, refused, letters):
            return False
        for topic, envelopes in by_topic.items():
            if not envelopes:  # its batch could not be read
                continue
            handler = self.handlers.get(topic)
            if handler is None:
                log.warning("no handler for topic %s; %d messages skipped", topic, len(envelopes))
                continue
            if not self._with_retry(handler, envelopes, letters):
                return False
        if self.dlq_producer and letters:  # in the order of the topics, whoever refused them
            letters.sort(key=lambda d: (d.topic or "", d.partition if d.partition is not None else -1, d.offset or 0))
            self._publish_dead_letters(letters)
        self.stored_batches += 1
        return True

    def _store_refused(self, letters: Sequence[Any]) -> Any:
        """Keep what could not be read as dead letters (and count them), as a handler keeps its bad messages."""
        return self.runtime.pipeline.store([], list(letters), "kafka")

    def _with_retry(self, handler: Handler, envelopes: Sequence[Any], letters: list[Any]) -> bool:
        """Store with ``handler`` until it succeeds (False: stopped meanwhile); its dead letters join ``letters``."""
        delay = 0.5
        attempt = 0
        while True:
            try:
                result = handler(envelopes)
            except Exception as exc:  # storage or broker trouble: retry the same batch, never skip it
                attempt += 1
                self.runtime.metrics.ingest_errors.labels("store").inc()
                # the traceback once; each retry after it one line (a statement's text can run to megabytes)
                log.error(
                    "storing a batch of %d failed (attempt %d); retrying in %.1fs: %s",
                    len(envelopes),
                    attempt,
                    delay,
                    db_detail(exc),
                    exc_info=attempt == 1,
                )
                # its frames hold the batch's decoded documents, in a cycle through SQLAlchemy's: freed before the
                # wait rather than kept through it and then until the collector's next run
                without_frames(exc)
                wait = delay * (0.5 + random.random())
                self.heartbeat.beat(idle=wait)  # waiting out a database that is away is not a stall
                if self.stopping.wait(wait):
                    return False
                self._update_lag(fetch_ends=True)  # a stuck batch shows as lag that is not going down
                delay = min(delay * 2, 30.0)
                continue
            letters.extend(getattr(result, "dead_letters", None) or ())
            return True

    def _commit(self) -> None:
        from kafka.errors import CommitFailedError, KafkaError

        try:
            self.consumer.commit()
        except CommitFailedError:
            # The group rebalanced while we processed; the new owner re-reads these (idempotently).
            log.warning("offset commit failed after a rebalance; the batch will be redelivered")
        except KafkaError:
            self.runtime.metrics.ingest_errors.labels("commit").inc()
            log.exception("offset commit failed")
            # kept: the next commit writes every assigned partition's position, these included, and the
            # lag must then count them committed (dropped, a partition's lag stayed at the failed batch's
            # size until it got new messages)
            return
        else:
            self._committed.update(self._pending)
        self._pending = {}

    def _commit_passed(self) -> None:
        """Commit where a partition's reading has moved past what held no message: a transaction's commit or
        abort marker, an aborted transaction's messages (read committed). No poll returns them, so the
        group's offset, and the lag, stayed behind them until the next message was stored. A partition
        nothing was polled from yet (one holding only aborted transactions) is asked its group offset once,
        when its reading has moved at all."""
        from kafka.errors import KafkaError
        from kafka.structs import OffsetAndMetadata

        passed: dict[Any, int] = {}
        ask = True  # a coordinator that does not answer is asked once per pass, not once per partition
        for tp in self.consumer.assignment() | self._committed.keys():
            try:
                position = self.consumer.position(tp, timeout_ms=1000)
            except Exception:  # moved elsewhere meanwhile (a rebalance): its new owner commits it
                continue
            if not position:  # nothing passed yet
                continue
            done = self._committed.get(tp)
            if done is None:
                if not ask:
                    continue
                try:
                    done = self.consumer.committed(tp, timeout_ms=1000)
                except Exception:  # asked again at the next poll that returns nothing
                    ask = False
                    continue
                if done is None:  # the group has none: whatever was passed is committed
                    done = 0
                else:
                    self._committed[tp] = done
            if position > done:
                passed[tp] = position
        if not passed:
            return
        try:
            self.consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in passed.items()})
        except KafkaError as exc:  # tried again at the next empty poll
            self.runtime.metrics.ingest_errors.labels("commit").inc()
            log.warning("committing past %d partition(s) with no messages failed: %s", len(passed), exc)
            return
        self._committed.update(passed)

    def _polled(self, records: dict[Any, list[Any]]) -> None:
        """Note where a polled batch starts and ends. A partition this worker has not committed on yet
        starts at its committed offset (or, with none, where the group's reset put it): its batch's first
        offset, since the worker commits each batch before it polls the next."""
        for tp, msgs in (records or {}).items():
            if msgs:
                self._committed.setdefault(tp, msgs[0].offset)
                self._pending[tp] = msgs[-1].offset + 1

    def _update_lag(self, fetch_ends: bool = False) -> None:
        """``vigil_consumer_lag_messages``: each assigned partition's end offset minus its committed offset,
        so a consumer stuck on a batch shows the batch and all behind it. Between polls the end offsets are
        asked of the broker (``fetch_ends``), as no fetch brings them in."""
        m = self.runtime.metrics
        assigned = self.consumer.assignment()
        m.consumer_assigned_partitions.set(len(assigned))
        for tp in list(self._committed):
            if tp not in assigned:  # moved to another member: its lag is theirs to report
                del self._committed[tp]
        ends: dict[Any, int] = {}
        if fetch_ends:
            from kafka.structs import TopicPartition

            # with nothing assigned (a spare consumer) the first partition of each topic answers for the brokers
            asked = list(assigned) or [TopicPartition(topic, 0) for topic in self.handlers]
            try:
                ends = self.consumer.end_offsets(asked, timeout_ms=2000)
            except Exception:  # a broker away as well: the last known end offsets serve
                log.debug("end offsets lookup failed", exc_info=True)
            else:
                self._broker_answered()
        current: set[tuple[str, int]] = set()
        for tp in assigned:
            known = [h for h in (ends.get(tp), self.consumer.highwater(tp)) if h is not None]
            if not known:
                continue
            high = max(known)  # an end offset never goes back: the larger of the two is the newer
            done = self._committed.get(tp)
            if done is None:  # nothing polled here yet: the fetch position is the committed offset
                try:
                    done = self.consumer.position(tp, timeout_ms=1000)
                except Exception:  # position lookups can fail during a rebalance; lag is best effort
                    continue
            if done is None:
                continue
            current.add((tp.topic, tp.partition))
            m.consumer_lag.labels(tp.topic, str(tp.partition)).set(max(0, high - done))
        for gone in self._lag_partitions - current:
            with contextlib.suppress(KeyError):
                m.consumer_lag.remove(gone[0], str(gone[1]))
        self._lag_partitions = current

    def _probe_due(self) -> bool:
        now = time.monotonic()
        if now - self._probed_at < BROKER_PROBE_SECONDS:
            return False
        self._probed_at = now
        return True

    def _broker_answered(self) -> None:
        self.runtime.metrics.consumer_broker_answered.set(time.time())

    def _close(self) -> None:
        try:
            self.consumer.close(autocommit=False)
        except Exception:  # closing a consumer whose broker is gone must not mask the real error
            log.debug("consumer close failed", exc_info=True)


_BLANKS = b" \t\r\n"


def unframed(value: bytes) -> tuple[bytes, str | None]:
    """A value in a schema registry's wire format (magic byte 0, a 4-byte schema id, the payload): its payload
    if that is JSON, as a JSON Schema serializer writes it, or why it is refused (an Avro or Protobuf payload).
    Any other value is returned as it is: no JSON starts with a zero byte."""
    if len(value) < 5 or value[0] != 0:
        return value, None
    first = next((b for b in value[5:69] if b not in _BLANKS), None)
    if first in (0x7B, 0x5B):  # { or [
        return value[5:], None
    schema = int.from_bytes(value[1:5], "big")
    return value, (
        f"a schema registry's wire format (magic byte 0, schema id {schema}) whose payload is not JSON (Avro or "
        "Protobuf, which Vigil does not read): produce JSON, plain or with a JSON Schema serializer"
    )


def produce_conversations(producer: Any, topic: str, items: Sequence[tuple[str, bytes]]) -> None:
    for key, value in items:
        producer.send(topic, key=key.encode(), value=value)
    producer.flush(timeout=60)


def encode(obj: Any) -> bytes:
    return orjson.dumps(obj)
