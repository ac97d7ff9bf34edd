"""``mqstore-commitlog``: a PySpark data source over a store's CommitLog files, for jobs that run
on a Spark cluster instead of on the broker (services.spark.jobs).

``spark.read.format("mqstore-commitlog").load("<store>/commitlog")``: each CommitLog file
(files are named by their first physical offset, spec sheet rocketmq-store-format §1) is read
through a read-only memory map and walked record by record with libstore's codec, body CRC
checked. The walk of a file ends at its blank END record or at its unwritten (zero) tail. A
record whose CRC does not match is still decoded and returned with ``crc_ok`` false; bytes that
are not a record at all give one row with ``size`` -1 and ``crc_ok`` false at their offset, and
end that file's walk (nothing after them can be located).

Partitions: one a file, unless the store is small for the cores reading it: fewer than twice as
many files holding records as the planning process may run on cores, one of them holding more
than 1.5 times a core's share of all their record bytes (every file but the newest is full, as
the log rolls only a full file; the newest one's records are walked to find their end, since
its size is its full size from the start, and that walk's cuts are kept), and the files to cut
holding at most DEFAULT_WALK_MAX_BYTES (4 GiB) in all. Then files are cut into runs of records
of about RUN_BYTES (128 MiB, Spark's own default for file sources). Option ``maxPartitionBytes``
cuts every file larger than it into runs of about that many bytes instead.

Records can only be found from the start of a file (each says where the next begins), so the
planning process walks a file it cuts up to its last cut, reading every record's header (each
record checked as the walk checks it, but for the CRC; reading the properties never fails):
0.3 s for a 1 GiB file of 1 KiB records in the page cache on the 2-core benchmark host, and the
whole file read once more from disk when it is not, which is why the default cuts only small
stores. It cuts only before records it has checked, so a run ends where the next one starts and
the last run of a file ends where the whole file's walk would: the rows are the same as with one
partition a file.

Option ``view``:

* ``messages`` (default): services.spark.rows.FILE_SCHEMA, the messages plus size, crc_ok and
  the file name; the stubs of transient messages (libstore.durability: their messages never
  reach the files) are skipped;
* ``dispatch``: what dispatch takes from each record (DISPATCH_SCHEMA: offsets, size, topic,
  queue, tags and tags code, keys, unique key, flags, times), as libstore.record_codec.check_record
  reads it; the rebuild job builds ConsumeQueues and IndexFiles from these rows.

The folder must be readable from every executor (a shared or copied volume on a cluster).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from libstore.dispatch_request import DispatchRequest
from libstore.errors import CorruptRecordError
from libstore.log_scanner import record_cuts
from libstore.message import MessageRecord, MessageSysFlag
from libstore.record_codec import check_record, decode_record
from services.spark.rows import FILE_SCHEMA, ROWS_PER_BATCH, BatchBuilder

DISPATCH_SCHEMA = (
    "commitlog_offset long, size int, topic string, queue_id int, queue_offset long, sys_flag int, "
    "born_timestamp long, store_timestamp long, prepared_offset long, tags string, tags_code long, "
    "keys array<string>, uniq_key string, crc_ok boolean, file string"
)
_ZERO = struct.Struct(">ii")
RUN_BYTES = 128 * 1024 * 1024  # the runs the default partitioning cuts files into
DEFAULT_WALK_MAX_BYTES = 4 * 1024 * 1024 * 1024  # the most of the files it cuts may hold


@dataclass(frozen=True)
class CommitLogFile(InputPartition):
    """A run of one CommitLog file's records: from byte ``start`` of the file (where a record
    starts) up to byte ``end`` (where the next run starts; -1: the file's walk goes to its end)."""

    path: str
    base_offset: int
    start: int = 0
    end: int = -1


def commitlog_files(folder: str | Path) -> list[CommitLogFile]:
    """The CommitLog files of ``folder`` in offset order. Raises FileNotFoundError /
    NotADirectoryError for a missing folder, ValueError when it holds no CommitLog file."""
    root = Path(folder)
    names = sorted(p for p in root.iterdir() if p.is_file() and p.name.isdigit())
    if not names:
        raise ValueError(f"{root} holds no CommitLog file (files named by their 20-digit offset)")
    return [CommitLogFile(str(p), int(p.name)) for p in names]


def commitlog_partitions(
    folder: str | Path, max_partition_bytes: int = 0, parallelism: int = 1
) -> list[CommitLogFile]:
    """The files of ``folder`` as :func:`commitlog_files` gives them, those larger than
    ``max_partition_bytes`` cut into runs of records of about that many bytes; with 0, into runs
    of RUN_BYTES when the store is small for ``parallelism`` cores (module docstring), else
    whole. Raises like :func:`commitlog_files`."""
    files = commitlog_files(folder)
    walked: dict[str, list[int]] = {}  # cuts at RUN_BYTES that deciding already found, by path
    if max_partition_bytes <= 0:
        if not _small_for(files, parallelism, walked):
            return files
        max_partition_bytes = RUN_BYTES
    out: list[CommitLogFile] = []
    for f in files:
        if os.path.getsize(f.path) <= max_partition_bytes:
            out.append(f)
            continue
        cuts = walked.get(f.path)
        if cuts is None:
            cuts = _cut_points(f.path, f.base_offset, max_partition_bytes)[0]
        starts = [0, *cuts]
        ends = [*starts[1:], -1]
        out += [CommitLogFile(f.path, f.base_offset, a, b) for a, b in zip(starts, ends, strict=True)]
    return out


def _small_for(files: list[CommitLogFile], parallelism: int, walked: dict[str, list[int]]) -> bool:
    """Whether ``files`` are few for ``parallelism`` cores, one of them holds more than half as
    much again as a core's share of their records, and what cutting them would walk is at most
    DEFAULT_WALK_MAX_BYTES (module docstring). The newest file's cuts at RUN_BYTES, found on the
    way to its end of records, go into ``walked``, so that it is not walked twice."""
    holding = [f for f in files if _holds_records(f.path)]
    if not holding or len(holding) >= 2 * parallelism:
        return False
    sizes = [os.path.getsize(f.path) for f in holding]
    if sum(size for size in sizes if size > RUN_BYTES) > DEFAULT_WALK_MAX_BYTES:
        return False
    newest = holding[-1]
    cuts, stop = _cut_points(newest.path, newest.base_offset, RUN_BYTES)
    walked[newest.path] = cuts
    if not cuts or cuts[-1] + RUN_BYTES < sizes[-1]:  # else it stopped at its last cut: nearly full
        sizes[-1] = stop  # its records' end
    return _uneven(sizes, parallelism)


def _uneven(sizes: list[int], parallelism: int) -> bool:
    """Whether the largest of ``sizes`` (bytes of records, one a file) is more than 1.5 times a
    core's share of them all: one partition a file would leave cores idle while it is read."""
    return 2 * max(sizes) * parallelism > 3 * sum(sizes)


def _holds_records(path: str) -> bool:
    """Whether the file starts with something other than its unwritten (zero) tail."""
    with _mapped(path) as buf:
        return not _data_ends(buf, 0)


def _cut_points(path: str, base_offset: int, every: int) -> tuple[list[int], int]:
    """libstore.log_scanner.record_cuts over one file: where runs of records of about ``every``
    bytes start, before records that check out as either view's walk checks them (reading the
    properties never fails), none past bytes that are not such a record; and where the walk
    stopped."""
    with _mapped(path) as buf:
        return record_cuts(buf, base_offset, every)


@contextmanager
def _mapped(path: str) -> Iterator[Any]:
    """The file's bytes, memory-mapped read-only (b"" for an empty file)."""
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            yield b""
            return
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield buf
        finally:
            buf.close()


def _data_ends(buf: Any, pos: int) -> bool:
    """No record starts at ``pos``: the end of the file, or its unwritten (zero) tail."""
    return pos + 8 > len(buf) or _ZERO.unpack_from(buf, pos) == (0, 0)


def walk(
    path: str, base_offset: int, *, decode_properties: bool = False, start: int = 0, end: int = -1
) -> Iterator[tuple[int, DispatchRequest | None, bool]]:
    """(position, request, crc_ok) per record of one file from byte ``start`` (where a record
    starts) up to byte ``end`` (-1: no bound), ``request`` as check_record reads it; None for
    bytes that are not a record where one must start (its PHYSICALOFFSET included): the walk
    ends there. One CRC-checked pass per record; only a failing record is looked at again. Ends
    at the blank END record."""
    with _mapped(path) as buf:
        pos, length = start, len(buf)
        stop = length if end < 0 else end
        while pos < stop and not _data_ends(buf, pos):
            expected = base_offset + pos
            req = check_record(
                buf, pos, length, expected_phy_offset=expected, decode_properties=decode_properties
            )
            crc_ok = req.success
            if not crc_ok:  # a CRC mismatch, or not a record at all?
                req = check_record(
                    buf,
                    pos,
                    length,
                    check_crc=False,
                    expected_phy_offset=expected,
                    decode_properties=decode_properties,
                )
            if req.success and req.msg_size == 0:
                return  # blank END record: the rest of the file is padding
            if not req.success:
                yield pos, None, False
                return
            yield pos, req, crc_ok
            pos += req.msg_size


def _default_parallelism() -> int:
    """The cores the planning process may run on: Spark plans a Python data source's read in a
    Python worker of the driver, where no session can be asked for its parallelism; on one
    machine (``local[*]``) they are the executors' cores."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


class CommitLogDataSource(DataSource):
    """The ``mqstore-commitlog`` format (see module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "mqstore-commitlog"

    def schema(self) -> str:
        return DISPATCH_SCHEMA if self._view() == "dispatch" else FILE_SCHEMA

    def _view(self) -> str:
        view = str(self.options.get("view") or "messages").lower()
        if view not in ("messages", "dispatch"):
            raise ValueError(f"option view must be messages or dispatch, got {view!r}")
        return view

    def _max_partition_bytes(self) -> int:
        raw = self.options.get("maxPartitionBytes")
        if raw is None or raw == "":
            return 0
        try:
            value = int(str(raw))
        except ValueError:
            value = 0
        if value <= 0:
            raise ValueError(f"option maxPartitionBytes must be a positive number of bytes, got {raw!r}")
        return value

    def reader(self, schema: StructType) -> DataSourceReader:
        path = self.options.get("path")
        if not path:
            raise ValueError('give the CommitLog folder: .load("<store>/commitlog")')
        return CommitLogReader(str(path), self._view(), self._max_partition_bytes())


class CommitLogReader(DataSourceReader):
    """Reads the partitions :func:`commitlog_partitions` gives (module docstring)."""

    def __init__(self, path: str, view: str, max_partition_bytes: int = 0) -> None:
        self.path = path
        self.view = view
        self.max_partition_bytes = max_partition_bytes  # 0: by the planning machine's cores

    def partitions(self) -> list[CommitLogFile]:
        parallelism = 1 if self.max_partition_bytes else _default_parallelism()
        return commitlog_partitions(self.path, self.max_partition_bytes, parallelism)

    def read(self, partition: CommitLogFile) -> Iterator[Any]:  # type: ignore[override]
        if self.view == "dispatch":
            yield from _dispatch_batches(partition)
            return
        name = Path(partition.path).name
        builder = BatchBuilder(with_file=True)
        good: list[MessageRecord] = []  # records that checked out, added to the builder in runs
        records = _records(partition.path, partition.base_offset, partition.start, partition.end)
        for pos, rec, crc_ok in records:
            if rec is not None and crc_ok:
                good.append(rec)
                if len(builder) + len(good) < ROWS_PER_BATCH:
                    continue
            builder.extend(good, file=name)
            good = []
            if rec is None:
                builder.add_unreadable(partition.base_offset + pos, name)
            elif not crc_ok:
                builder.add(rec, crc_ok=False, file=name)
            if len(builder) >= ROWS_PER_BATCH:
                yield builder.take()
        builder.extend(good, file=name)
        if len(builder):
            yield builder.take()


def _records(
    path: str, base_offset: int, start: int = 0, end: int = -1
) -> Iterator[tuple[int, MessageRecord | None, bool]]:
    """(position, record, crc_ok) per record of one file from ``start`` up to ``end`` (as in
    :func:`walk`), decoded in one CRC-checked pass (the messages view); None, as in
    :func:`walk`, for bytes that are not the record due there."""
    with _mapped(path) as buf:
        pos, length = start, len(buf)
        stop = length if end < 0 else end
        while pos < stop and not _data_ends(buf, pos):
            expected = base_offset + pos
            try:
                rec, crc_ok = decode_record(buf, pos, length), True
            except CorruptRecordError:  # a CRC mismatch, a blank END record, or no record
                req = check_record(buf, pos, length, check_crc=False, decode_properties=False)
                if req.success and req.msg_size == 0:
                    return
                if not req.success:
                    yield pos, None, False
                    return
                rec, crc_ok = decode_record(buf, pos, length, check_crc=False), False
            if rec.phy_offset != expected:  # a record, but not the one this position holds
                yield pos, None, False
                return
            if not rec.sys_flag & MessageSysFlag.TRANSIENT_STUB_FLAG:
                yield pos, rec, crc_ok
            pos += rec.total_size


def dispatch_arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("commitlog_offset", pa.int64()),
            ("size", pa.int32()),
            ("topic", pa.string()),
            ("queue_id", pa.int32()),
            ("queue_offset", pa.int64()),
            ("sys_flag", pa.int32()),
            ("born_timestamp", pa.int64()),
            ("store_timestamp", pa.int64()),
            ("prepared_offset", pa.int64()),
            ("tags", pa.string()),
            ("tags_code", pa.int64()),
            ("keys", pa.list_(pa.string())),
            ("uniq_key", pa.string()),
            ("crc_ok", pa.bool_()),
            ("file", pa.string()),
        ]
    )


def _dispatch_batches(partition: CommitLogFile) -> Iterator[Any]:
    import pyarrow as pa

    schema = dispatch_arrow_schema()
    name = Path(partition.path).name
    columns: list[list[Any]] = [[] for _ in schema.names]

    def take() -> Any:
        arrays = [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)]
        for col in columns:
            col.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    records = walk(
        partition.path,
        partition.base_offset,
        decode_properties=True,
        start=partition.start,
        end=partition.end,
    )
    for pos, req, crc_ok in records:
        if req is None:
            offset = partition.base_offset + pos
            row: tuple[Any, ...] = (offset, -1, *[None] * 11, False, name)
        else:
            row = (
                req.commit_log_offset,
                req.msg_size,
                req.topic,
                req.queue_id,
                req.consume_queue_offset,
                req.sys_flag,
                req.born_timestamp,
                req.store_timestamp,
                req.prepared_transaction_offset,
                req.tags,
                req.tags_code,
                list(req.keys),
                req.uniq_key,
                crc_ok,
                name,
            )
        for col, value in zip(columns, row, strict=True):
            col.append(value)
        if len(columns[0]) >= ROWS_PER_BATCH:
            yield take()
    if columns[0]:
        yield take()


def dispatch_request(row: Any) -> DispatchRequest:
    """The DispatchRequest a ``view=dispatch`` row came from (a pyspark Row or a dict)."""
    return DispatchRequest(
        True,
        row["size"],
        row["topic"],
        row["queue_id"],
        row["commitlog_offset"],
        row["queue_offset"],
        row["sys_flag"],
        row["born_timestamp"],
        row["store_timestamp"],
        row["prepared_offset"],
        row["tags"],
        row["tags_code"],
        tuple(row["keys"] or ()),
        row["uniq_key"],
    )
