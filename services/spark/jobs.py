"""Spark jobs over a store's CommitLog files (``mqstore spark verify|rebuild|stats``), so heavy
scans run on a Spark cluster instead of on the broker. Each reads the files through the
``mqstore-commitlog`` source (a partition a file, or runs of records of one for a small store;
services.spark.commitlog_source).

* :func:`verify`: per file, records, bytes, CRC failures, unreadable bytes and the offset range;
  and whether each file's first record starts at the file's base offset.
* :func:`rebuild`: ConsumeQueue and IndexFile files for the log, byte for byte what dispatch
  builds: the records are decoded as dispatch decodes them (check_record, tags codes included)
  and fed to libstore's own ConsumeQueueStore (one task per group of queues, each queue in log
  order) and IndexService (one task, in log order: an IndexFile is one sequential structure).
  Dispatch checkpoints are written at the end of the log, so a dispatch or index service started
  on the result resumes there. Records failing their CRC are left out (recovery cuts the log at
  the first one, so dispatch never sees them).
* :func:`stats`: messages and bytes per topic per hour of store time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libstore.config import StoreConfig
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.dispatch import DispatchCheckpoint
from libstore.index_service import IndexService
from libstore.store_paths import consume_queue_dir, dispatch_checkpoint_path, index_dir
from services.spark.commitlog_source import dispatch_request

CHUNK = 4096


def _dispatch_frame(spark: Any, commitlog_dir: str | Path) -> Any:
    return spark.read.format("mqstore-commitlog").option("view", "dispatch").load(str(commitlog_dir))


@dataclass
class FileReport:
    file: str
    records: int
    bytes: int
    crc_failures: int
    unreadable: int
    first_offset: int | None
    end_offset: int | None

    @property
    def starts_at_base(self) -> bool:
        return self.first_offset is None or self.first_offset == int(self.file)


@dataclass
class VerifyReport:
    files: list[FileReport] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(f.records for f in self.files)

    @property
    def crc_failures(self) -> int:
        return sum(f.crc_failures for f in self.files)

    @property
    def unreadable(self) -> int:
        return sum(f.unreadable for f in self.files)

    @property
    def ok(self) -> bool:
        return not self.crc_failures and not self.unreadable and all(f.starts_at_base for f in self.files)


def verify(spark: Any, commitlog_dir: str | Path) -> VerifyReport:
    """Check every record of every CommitLog file (see module docstring)."""
    from pyspark.sql import functions as F

    from services.spark.commitlog_source import commitlog_files

    df = _dispatch_frame(spark, commitlog_dir)
    good = F.col("size") > 0
    rows = (
        df.groupBy("file")
        .agg(
            F.sum(F.when(good, 1).otherwise(0)).alias("records"),
            F.sum(F.when(good, F.col("size")).otherwise(0)).alias("bytes"),
            F.sum(F.when(good & ~F.col("crc_ok"), 1).otherwise(0)).alias("crc_failures"),
            F.sum(F.when(~good, 1).otherwise(0)).alias("unreadable"),
            F.min("commitlog_offset").alias("first_offset"),
            F.max(F.when(good, F.col("commitlog_offset") + F.col("size"))).alias("end_offset"),
        )
        .collect()
    )
    by_file = {r["file"]: r for r in rows}
    report = VerifyReport()
    for f in commitlog_files(commitlog_dir):  # files without a record are reported too
        name = Path(f.path).name
        r = by_file.get(name)
        if r is None:
            report.files.append(FileReport(name, 0, 0, 0, 0, None, None))
        else:
            report.files.append(
                FileReport(
                    name,
                    int(r["records"]),
                    int(r["bytes"]),
                    int(r["crc_failures"]),
                    int(r["unreadable"]),
                    r["first_offset"],
                    r["end_offset"],
                )
            )
    return report


@dataclass
class RebuildReport:
    records: int
    queues: int
    index_files: int
    log_end: int


def _chunks(rows: Iterable[Any]) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for row in rows:
        chunk.append(dispatch_request(row))
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _write_queues(rows: Iterable[Any], cq_dir: str, file_size: int) -> None:
    store = ConsumeQueueStore(Path(cq_dir), file_size)
    try:
        for chunk in _chunks(rows):
            store.dispatch_batch(chunk)
        store.flush_all()
    finally:
        store.shutdown()


def _write_index(rows: Iterable[Any], idx_dir: str, slots: int, entries: int, batch: int) -> None:
    index = IndexService(Path(idx_dir), slots, entries, batch)
    index.load()
    try:
        for chunk in _chunks(rows):
            index.dispatch_batch(chunk)
        index.flush_all()
    finally:
        index.shutdown()


def rebuild(
    spark: Any, commitlog_dir: str | Path, out_root: str | Path, config: StoreConfig
) -> RebuildReport:
    """Write ``consumequeue/`` and ``index/`` under ``out_root`` (which must not hold them yet)
    from the CommitLog in ``commitlog_dir``; sizes from ``config`` (mappedFileSizeConsumeQueue,
    maxHashSlotNum, maxIndexNum), which must be the store's. Raises FileExistsError when
    ``out_root`` already holds derived files."""
    from pyspark.sql import functions as F

    out = Path(out_root)
    cq_dir, idx_dir = consume_queue_dir(out), index_dir(out)
    for d in (cq_dir, idx_dir):
        if d.exists() and any(d.iterdir()):
            raise FileExistsError(f"{d} is not empty: rebuild into a fresh folder")
        d.mkdir(parents=True, exist_ok=True)
    df = (
        _dispatch_frame(spark, commitlog_dir)
        .filter(F.col("crc_ok") & (F.col("size") > 0))
        .drop("file", "crc_ok")
    )
    df = df.persist()
    try:
        summary = df.agg(
            F.count("*").alias("records"),
            F.max(F.col("commitlog_offset") + F.col("size")).alias("end"),
            F.countDistinct("topic", "queue_id").alias("queues"),
        ).collect()[0]
        cq_path, size = str(cq_dir), config.mapped_file_size_consume_queue
        (
            df.repartition("topic", "queue_id")
            .sortWithinPartitions("topic", "queue_id", "commitlog_offset")
            .foreachPartition(lambda rows: _write_queues(rows, cq_path, size))
        )
        idx_path = str(idx_dir)
        slots, entries, batch = config.max_hash_slot_num, config.max_index_num, config.max_msgs_num_batch
        if config.message_index_enable:
            (
                df.filter((F.size("keys") > 0) | F.col("uniq_key").isNotNull())
                .repartition(1)
                .sortWithinPartitions("commitlog_offset")
                .foreachPartition(lambda rows: _write_index(rows, idx_path, slots, entries, batch))
            )
    finally:
        df.unpersist()
    log_end = int(summary["end"] or 0)
    for d in (cq_dir, idx_dir):
        DispatchCheckpoint(dispatch_checkpoint_path(d)).save(log_end)
    index_files = sum(1 for p in idx_dir.iterdir() if p.name.isdigit())
    return RebuildReport(int(summary["records"]), int(summary["queues"]), index_files, log_end)


def stats(spark: Any, commitlog_dir: str | Path) -> list[dict[str, Any]]:
    """Messages and bytes per topic per hour of store time (UTC), oldest hour first:
    ``[{"topic", "hour" (datetime), "messages", "bytes"}]``."""
    from pyspark.sql import functions as F

    df = _dispatch_frame(spark, commitlog_dir).filter(F.col("size") > 0)
    hour_ms = F.floor(F.col("store_timestamp") / 3_600_000) * 3_600_000
    rows = (
        df.groupBy("topic", hour_ms.alias("hour_ms"))
        .agg(F.count("*").alias("messages"), F.sum("size").alias("bytes"))
        .orderBy("hour_ms", "topic")
        .collect()
    )
    from datetime import UTC, datetime

    return [
        {
            "topic": r["topic"],
            "hour": datetime.fromtimestamp(r["hour_ms"] / 1000, UTC),
            "messages": int(r["messages"]),
            "bytes": int(r["bytes"]),
        }
        for r in rows
    ]
