"""``mqstore``: a PySpark data source (pyspark.sql.datasource) to read topics in batch and as a
stream, and to write DataFrames to topics, through the gateway's gRPC API.

Register once per session (``spark.dataSource.register(MqstoreDataSource)``, done by
services.spark.session), then::

    spark.read.format("mqstore").option("endpoint", "127.0.0.1:8081").option("topic", "Orders").load()
    spark.readStream.format("mqstore").option("topic", "Orders").option("maxRecordsPerTrigger", 10000).load()
    df.write.format("mqstore").option("topic", "Orders").mode("append").save()

Options (keys are case-insensitive):

* ``endpoint``: the gateway, host:port (default 127.0.0.1:8081); ``topic``: required.
* ``startingOffsets``: ``earliest`` (batch default), ``latest`` (stream default) or JSON
  ``{"0": 10, "3": 0}`` per queue id (queues not named start at the earliest);
  ``endingOffsets`` (batch): ``latest`` (default) or JSON. ``startingTimestamp`` /
  ``endingTimestamp``: store time (ms since the epoch); each queue starts/ends at its first
  message stored at or after it (they win over the offsets).
* ``maxRecordsPerPartition`` (batch, default 100000): a queue's range is split into partitions of
  at most this many messages. ``maxRecordsPerTrigger`` (stream): admission control, spread over
  the queues by their backlog; ``trigger(availableNow=True)`` honours it.
* ``pullBatchSize`` (default 1024): messages per Pull call.
* ``failOnDataLoss`` (default true, as Kafka's source): when messages of a planned range were
  deleted by retention before the query read them, the task fails with a message naming the
  queue and the offsets lost; ``false`` skips them and logs it.
* TLS to the gateway (services._common.tls): ``tls.ca`` (PEM CA to verify the gateway; the
  system's roots when only a client certificate is given), ``tls.cert`` and ``tls.key`` (a client
  certificate, for a gateway started with ``--tls-client-ca``), ``tls.serverName`` (the name
  expected in the gateway's certificate instead of the endpoint's host). Paths, read where the
  channels are opened: the files must exist on the driver and on every executor.
* ``accessKey`` / ``secretKey``: an account of the gateway's ``--acl-file``; every call is then
  signed. A reader needs SUB on the topic and on group ``mqstore-spark`` (its pulls name explicit
  offsets and never commit); a writer PUB on the topic.

Rows (services.spark.rows.MESSAGE_SCHEMA): topic, queue_id, queue_offset, commitlog_offset, msg_id
(the producer's UNIQ_KEY, else the offset message id), tags, keys, properties, body,
born_timestamp, store_timestamp. Readers yield pyarrow record batches.

Streaming offsets are ``{"<queue id>": next offset}`` (JSON, string keys): Spark's checkpoint
holds them, so a restarted query resumes where its last committed batch ended and reads
nothing twice; queues added to the topic later are read from their start. Each batch is a
fixed offset range, so a batch re-run after a failure reads the same messages.

Writing: each row's ``body`` (binary or string) is required; ``keys`` (array or space-separated
string), ``tags``, ``properties`` (map), ``queue`` (int, -1 or absent: placed round robin),
``topic`` (overrides the option) and ``uniq_key`` are optional. Rows go out in Produce calls of
``writeBatchSize`` (default 256). The guarantee is **at least once**: a failed task is retried
by Spark and sends its rows again, and messages already stored are not taken back. Give rows a
``uniq_key`` (a stable id) to make the retry harmless: the commitlog drops a repeated
(topic, UNIQ_KEY) within its de-duplication window, and consumers can de-duplicate on msg_id
beyond it.

gRPC channels are opened inside the executors' read and write calls (and lazily in the
driver-side stream reader), never pickled.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from libstore import ConfigError
from libstore.message import MessageConst
from libstore.record_codec import decode_records
from services._common.tls import TlsConfig
from services.credentials import Credentials
from services.spark.rows import MESSAGE_SCHEMA, ROWS_PER_BATCH, BatchBuilder

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "127.0.0.1:8081"
READER_GROUP = "mqstore-spark"  # pulls name explicit offsets; the group's own offsets are untouched


class OptionError(ValueError):
    """A data source option is missing or malformed."""


def _opt(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = options.get(name)  # CaseInsensitiveDict: keys compare lower-cased
    return default if value is None or value == "" else str(value)


def _int_opt(options: Mapping[str, str], name: str, default: int) -> int:
    text = _opt(options, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {text!r}") from None
    if value <= 0:
        raise OptionError(f"option {name} must be > 0, got {value}")
    return value


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """Messages [start, end) of one queue."""

    topic: str
    queue_id: int
    start: int
    end: int


@dataclass(frozen=True)
class TlsOptions:
    """The ``tls.*`` options (PEM paths; see module docstring), loaded where channels are opened:
    only paths travel to the executors, never key material."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str = ""

    @classmethod
    def of(cls, options: Mapping[str, str]) -> TlsOptions:
        """The options' TLS settings, checked now (OptionError for a bad or missing file)."""
        tls = cls(
            _opt(options, "tls.ca"),
            _opt(options, "tls.cert"),
            _opt(options, "tls.key"),
            _opt(options, "tls.serverName", "") or "",
        )
        tls.load()
        return tls

    def load(self) -> TlsConfig | None:
        """The TlsConfig for the client classes (None: plaintext). Raises OptionError."""
        try:
            return TlsConfig.load(self.cert, self.key, self.ca, server_name=self.server_name)
        except ConfigError as exc:
            raise OptionError(f"tls options: {exc}") from None


class _Store:
    """The gateway calls a reader needs (opened where used; see module docstring)."""

    def __init__(
        self,
        endpoint: str,
        topic: str,
        tls: TlsOptions | None = None,
        credentials: Credentials | None = None,
        fail_on_data_loss: bool = True,
    ) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.tls = tls or TlsOptions()
        self.credentials = credentials
        self.fail_on_data_loss = fail_on_data_loss

    def queue_offsets(self, timestamp_ms: int = 0) -> dict[int, tuple[int, int, int]]:
        """queue id -> (min, max, offset at ``timestamp_ms``)."""
        from services.client import Admin

        with Admin(self.endpoint, tls=self.tls.load(), credentials=self.credentials) as admin:
            return {
                q.queue_id: (q.min_offset, q.max_offset, q.offset_at_time)
                for q in admin.queue_offsets(self.topic, timestamp_ms)
            }

    def read(self, p: QueueRange, pull_batch: int) -> Iterator[Any]:
        """Arrow batches of the messages of ``p``."""
        from services.client import PullConsumer

        builder = BatchBuilder()
        with PullConsumer(
            self.endpoint,
            READER_GROUP,
            p.topic,
            queues=[p.queue_id],
            tls=self.tls.load(),
            credentials=self.credentials,
        ) as consumer:
            offset = p.start
            # One pull ahead: the store serves the next pull while this task decodes the last.
            pending = consumer.prefetch_raw(p.queue_id, offset, min(pull_batch, p.end - offset))
            while offset < p.end:
                skipped_before = consumer.skipped.get(p.queue_id, 0)
                raws, nxt = pending()
                lost = consumer.skipped.get(p.queue_id, 0) - skipped_before
                if lost:
                    self._data_lost(p, offset, min(nxt, p.end), lost)
                if nxt <= offset:
                    # A range Spark planned (and will record as read) must not end short: a
                    # lagging replica's dispatch answered, say. Fail the task; Spark retries it.
                    raise RuntimeError(
                        f"{p.topic} queue {p.queue_id}: nothing readable at offset {offset} "
                        f"(partition ends at {p.end})"
                    )
                if nxt < p.end:
                    pending = consumer.prefetch_raw(p.queue_id, nxt, min(pull_batch, p.end - nxt))
                records = decode_records(raws)
                while records and records[-1].queue_offset >= p.end:  # past the planned range
                    records.pop()
                builder.extend(records)
                if len(builder) >= ROWS_PER_BATCH:
                    yield builder.take()
                offset = nxt
        if len(builder):
            yield builder.take()

    def _data_lost(self, p: QueueRange, offset: int, upto: int, lost: int) -> None:
        """``lost`` messages in [offset, upto) of ``p`` were deleted (retention) before this
        read: fail the task (failOnDataLoss) or log it and go on."""
        what = (
            f"{p.topic} queue {p.queue_id}: {lost} message(s) between offsets {offset} and {upto} "
            f"were deleted (retention) before this query read them"
        )
        if self.fail_on_data_loss:
            raise RuntimeError(f"{what}; set the option failOnDataLoss to false to skip them")
        log.warning("%s; skipped (failOnDataLoss=false)", what)


def _offsets_option(text: str, what: str) -> dict[int, int] | str:
    if text in ("earliest", "latest"):
        return text
    try:
        raw = json.loads(text)
        return {int(q): int(o) for q, o in raw.items()}
    except (ValueError, AttributeError, TypeError):
        raise OptionError(
            f'{what} must be earliest, latest or JSON {{"<queue id>": offset}}, got {text!r}'
        ) from None


def _resolve(
    spec: dict[int, int] | str, queues: dict[int, tuple[int, int, int]], default_earliest: bool
) -> dict[int, int]:
    out = {}
    for qid, (lo, hi, _) in queues.items():
        if spec == "earliest":
            out[qid] = lo
        elif spec == "latest":
            out[qid] = hi
        else:
            assert isinstance(spec, dict)
            out[qid] = min(max(spec.get(qid, lo if default_earliest else hi), lo), hi)
    return out


class MqstoreDataSource(DataSource):
    """The ``mqstore`` format (see module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "mqstore"

    def schema(self) -> str:
        return MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError("topics are append-only: use mode('append')")
        return Writer(self.options)


def _store_of(options: Mapping[str, str]) -> _Store:
    topic = _opt(options, "topic")
    if not topic:
        raise OptionError("option topic is required")
    fail = (_opt(options, "failOnDataLoss", "true") or "true").strip().lower()
    if fail not in ("true", "false"):
        raise OptionError(f"option failOnDataLoss must be true or false, got {fail!r}")
    return _Store(
        _opt(options, "endpoint", DEFAULT_ENDPOINT) or DEFAULT_ENDPOINT,
        topic,
        TlsOptions.of(options),
        _credentials_of(options),
        fail_on_data_loss=fail == "true",
    )


def _credentials_of(options: Mapping[str, str]) -> Credentials | None:
    """The ``accessKey``/``secretKey`` options (both or neither). Raises OptionError."""
    ak, sk = _opt(options, "accessKey"), _opt(options, "secretKey")
    if bool(ak) != bool(sk):
        raise OptionError("options accessKey and secretKey go together")
    return Credentials(ak, sk) if ak and sk else None


class BatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.store = _store_of(options)
        self.pull_batch = _int_opt(options, "pullBatchSize", 1024)
        self.per_partition = _int_opt(options, "maxRecordsPerPartition", 100_000)
        self.starting = _offsets_option(_opt(options, "startingOffsets", "earliest") or "", "startingOffsets")
        self.ending = _offsets_option(_opt(options, "endingOffsets", "latest") or "", "endingOffsets")
        self.start_ts = int(_opt(options, "startingTimestamp", "0") or 0)
        self.end_ts = int(_opt(options, "endingTimestamp", "0") or 0)

    def partitions(self) -> list[QueueRange]:
        queues = self.store.queue_offsets(self.start_ts)
        if self.start_ts:
            starts = {q: at for q, (_, _, at) in queues.items()}
        else:
            starts = _resolve(self.starting, queues, True)
        ends = _resolve(self.ending, queues, False)
        if self.end_ts:
            ends = {q: at for q, (_, _, at) in self.store.queue_offsets(self.end_ts).items()}
        out = []
        for qid in sorted(queues):
            lo, hi = starts[qid], ends.get(qid, starts[qid])
            for a in range(lo, hi, self.per_partition):
                out.append(QueueRange(self.store.topic, qid, a, min(a + self.per_partition, hi)))
        return out

    def read(self, partition: QueueRange) -> Iterator[Any]:  # type: ignore[override]
        yield from self.store.read(partition, self.pull_batch)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over per-queue offsets (see module docstring)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.store = _store_of(options)
        self.pull_batch = _int_opt(options, "pullBatchSize", 1024)
        self.max_per_trigger = _int_opt(options, "maxRecordsPerTrigger", 0)  # 0: no limit
        self.starting = _offsets_option(_opt(options, "startingOffsets", "latest") or "", "startingOffsets")
        self.start_ts = int(_opt(options, "startingTimestamp", "0") or 0)
        self._target: dict[int, int] | None = None  # availableNow: stop here

    def _max_offsets(self) -> dict[int, int]:
        return {q: hi for q, (_, hi, _) in self.store.queue_offsets().items()}

    def initialOffset(self) -> dict[str, int]:
        queues = self.store.queue_offsets(self.start_ts)
        if self.start_ts:
            return {str(q): at for q, (_, _, at) in queues.items()}
        return {str(q): o for q, o in _resolve(self.starting, queues, True).items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._max_offsets()

    def reportLatestOffset(self) -> dict[str, int]:
        return {str(q): o for q, o in self._max_offsets().items()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        queues = self.store.queue_offsets()
        target = self._target if self._target is not None else {q: hi for q, (_, hi, _) in queues.items()}
        # A queue cleaned below its start has no backlog there: count from its min offset.
        begin = {int(q): max(o, queues.get(int(q), (0, 0, 0))[0]) for q, o in start.items()}
        lag = {q: max(0, hi - begin.get(q, 0)) for q, hi in target.items()}
        total = sum(lag.values())
        end = dict(target)
        if isinstance(limit, ReadMaxRows) and total > limit.max_rows:
            budget = limit.max_rows  # spread over the queues by backlog, at least 1 each with lag
            for q in sorted(lag):
                share = max(1, lag[q] * limit.max_rows // total) if lag[q] else 0
                take = min(lag[q], share, budget)
                end[q] = begin.get(q, 0) + take
                budget -= take
        for q, o in begin.items():  # never move backwards (a queue that was cut keeps its offset)
            end[q] = max(end.get(q, o), o)
        return {str(q): o for q, o in sorted(end.items())}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[QueueRange]:
        return [
            QueueRange(self.store.topic, int(q), start.get(q, 0), e)
            for q, e in end.items()
            if e > start.get(q, 0)
        ]

    def read(self, partition: QueueRange) -> Iterator[Any]:  # type: ignore[override]
        yield from self.store.read(partition, self.pull_batch)

    def commit(self, end: dict[str, int]) -> None:
        """Spark's checkpoint holds the offsets; nothing to acknowledge in the store."""


@dataclass
class WriteResult(WriterCommitMessage):
    partition_id: int
    messages: int


class Writer(DataSourceWriter):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.endpoint = _opt(options, "endpoint", DEFAULT_ENDPOINT) or DEFAULT_ENDPOINT
        self.topic = _opt(options, "topic") or ""
        self.batch = _int_opt(options, "writeBatchSize", 256)
        self.tls = TlsOptions.of(options)
        self.credentials = _credentials_of(options)

    def write(self, iterator: Iterator[Any]) -> WriteResult:
        from pyspark import TaskContext

        from services.client import OutgoingMessage, Producer

        sent = 0
        pending: list[OutgoingMessage] = []
        with Producer(self.endpoint, tls=self.tls.load(), credentials=self.credentials) as producer:

            def flush() -> None:
                nonlocal sent
                results = producer.send_batch(pending)
                if not results.all_ok:
                    lost = len(pending) - results.appended
                    raise RuntimeError(f"{lost} of {len(pending)} messages not stored: {results.status.name}")
                sent += len(pending)
                pending.clear()

            for row in iterator:
                pending.append(_outgoing(row.asDict(), self.topic))
                if len(pending) >= self.batch:
                    flush()
            if pending:
                flush()
        ctx = TaskContext.get()
        return WriteResult(ctx.partitionId() if ctx else 0, sent)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.messages for m in messages if isinstance(m, WriteResult))
        log.info("mqstore write: %d messages in %d tasks", total, len(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        stored = sum(m.messages for m in messages if isinstance(m, WriteResult))
        failed = sum(1 for m in messages if m is None)
        log.error(
            "mqstore write failed in %d of %d tasks; %d messages of the tasks that finished stay stored "
            "(at-least-once: a uniq_key column makes a rerun's repeats droppable)",
            failed,
            len(messages),
            stored,
        )


def _outgoing(row: dict[str, Any], topic_option: str) -> Any:
    from services.client import OutgoingMessage

    body = row.get("body")
    if body is None:
        raise OptionError("every row needs a body column (binary or string)")
    if isinstance(body, str):
        body = body.encode()
    topic = row.get("topic") or topic_option
    if not topic:
        raise OptionError("no topic: set option topic or give rows a topic column")
    keys = row.get("keys") or ()
    if isinstance(keys, str):
        keys = [k for k in keys.split(MessageConst.KEY_SEPARATOR) if k]
    props = dict(row.get("properties") or {})
    if row.get("uniq_key"):
        props[MessageConst.UNIQ_KEY] = str(row["uniq_key"])
    queue = row.get("queue")
    return OutgoingMessage(
        topic,
        bytes(body),
        row.get("tags") or None,
        list(keys),
        props,
        queue_id=-1 if queue is None else int(queue),
    )
