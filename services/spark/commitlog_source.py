"""``mqstore-commitlog``: a PySpark data source over a store's CommitLog files, for jobs that run
on a Spark cluster instead of on the broker (services.spark.jobs).

``spark.read.format("mqstore-commitlog").load("<store>/commitlog")``: one partition per
CommitLog file (files are named by their first physical offset, spec sheet rocketmq-store-format
§1), each read through a read-only memory map and walked record by record with libstore's codec,
body CRC checked. The walk of a file ends at its blank END record or at its unwritten (zero)
tail. A record whose CRC does not match is still decoded and returned with ``crc_ok`` false; bytes
that are not a record at all give one row with ``size`` -1 and ``crc_ok`` false at their offset,
and end that file's walk (nothing after them can be located).

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
from libstore.message import MessageRecord, MessageSysFlag
from libstore.record_codec import check_record, decode_record
from services.spark.rows import FILE_SCHEMA, ROWS_PER_BATCH, BatchBuilder

DISPATCH_SCHEMA = (
    "commitlog_offset long, size int, topic string, queue_id int, queue_offset long, sys_flag int, "
    "born_timestamp long, store_timestamp long, prepared_offset long, tags string, tags_code long, "
    "keys array<string>, uniq_key string, crc_ok boolean, file string"
)
_ZERO = struct.Struct(">ii")


@dataclass(frozen=True)
class CommitLogFile(InputPartition):
    path: str
    base_offset: int


def commitlog_files(folder: str | Path) -> list[CommitLogFile]:
    """The CommitLog files of ``folder`` in offset order. Raises FileNotFoundError /
    NotADirectoryError for a missing folder, ValueError when it holds no CommitLog file."""
    root = Path(folder)
    names = sorted(p for p in root.iterdir() if p.is_file() and p.name.isdigit())
    if not names:
        raise ValueError(f"{root} holds no CommitLog file (files named by their 20-digit offset)")
    return [CommitLogFile(str(p), int(p.name)) for p in names]


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
    path: str, base_offset: int, *, decode_properties: bool = False
) -> Iterator[tuple[int, DispatchRequest | None, bool]]:
    """(position, request, crc_ok) per record of one file, ``request`` as check_record reads
    it; None for bytes that are not a record where one must start (its PHYSICALOFFSET included):
    the walk ends there. One CRC-checked pass per record; only a failing record is looked at
    again. Ends at the blank END record."""
    with _mapped(path) as buf:
        pos, length = 0, len(buf)
        while not _data_ends(buf, pos):
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

    def reader(self, schema: StructType) -> DataSourceReader:
        path = self.options.get("path")
        if not path:
            raise ValueError('give the CommitLog folder: .load("<store>/commitlog")')
        return CommitLogReader(str(path), self._view())


class CommitLogReader(DataSourceReader):
    def __init__(self, path: str, view: str) -> None:
        self.path = path
        self.view = view

    def partitions(self) -> list[CommitLogFile]:
        return commitlog_files(self.path)

    def read(self, partition: CommitLogFile) -> Iterator[Any]:  # type: ignore[override]
        if self.view == "dispatch":
            yield from _dispatch_batches(partition)
            return
        name = Path(partition.path).name
        builder = BatchBuilder(with_file=True)
        good: list[MessageRecord] = []  # records that checked out, added to the builder in runs
        for pos, rec, crc_ok in _records(partition.path, partition.base_offset):
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


def _records(path: str, base_offset: int) -> Iterator[tuple[int, MessageRecord | None, bool]]:
    """(position, record, crc_ok) per record of one file, decoded in one CRC-checked pass (the
    messages view); None, as in :func:`walk`, for bytes that are not the record due there."""
    with _mapped(path) as buf:
        pos, length = 0, len(buf)
        while not _data_ends(buf, pos):
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

    for pos, req, crc_ok in walk(partition.path, partition.base_offset, decode_properties=True):
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
