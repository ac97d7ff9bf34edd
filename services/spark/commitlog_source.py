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
  the file name;
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from libstore.errors import CorruptRecordError
from libstore.message import MessageRecord
from libstore.record_codec import DispatchRequest, check_record, decode_record
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


def walk(
    path: str, base_offset: int, *, decode_properties: bool = False
) -> Iterator[tuple[Any, int, DispatchRequest | None, bool]]:
    """(buffer, position, request, crc_ok) per record of one file, ``request`` as
    check_record reads it (None for bytes that are not a record: the walk ends there). One
    CRC-checked pass per record; only a failing record is looked at again."""
    with open(path, "rb") as fh:
        length = os.fstat(fh.fileno()).st_size
        if length == 0:
            return
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            pos = 0
            while pos + 8 <= length:
                total, magic = _ZERO.unpack_from(buf, pos)
                if total == 0 and magic == 0:
                    return  # the unwritten tail of the last file
                req = check_record(buf, pos, length, decode_properties=decode_properties)
                crc_ok = req.success
                if not crc_ok:  # a CRC mismatch, or not a record at all?
                    req = check_record(buf, pos, length, check_crc=False, decode_properties=decode_properties)
                if req.success and req.msg_size == 0:
                    return  # blank END record: the rest of the file is padding
                if not req.success:
                    yield buf, pos, None, False
                    return
                yield buf, pos, req, crc_ok
                pos += req.msg_size
        finally:
            buf.close()


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
        for pos, rec, crc_ok in _records(partition.path):
            if rec is None:
                builder.add_unreadable(partition.base_offset + pos, name)
            else:
                builder.add(rec, crc_ok=crc_ok, file=name)
            if len(builder) >= ROWS_PER_BATCH:
                yield builder.take()
        if len(builder):
            yield builder.take()


def _records(path: str) -> Iterator[tuple[int, MessageRecord | None, bool]]:
    """(position, record, crc_ok) per record of one file, decoded in one CRC-checked pass (the
    messages view); None for bytes that are not a record (the walk ends there)."""
    with open(path, "rb") as fh:
        length = os.fstat(fh.fileno()).st_size
        if length == 0:
            return
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            pos = 0
            while pos + 8 <= length:
                total, magic = _ZERO.unpack_from(buf, pos)
                if total == 0 and magic == 0:
                    return
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
                yield pos, rec, crc_ok
                pos += rec.total_size
        finally:
            buf.close()


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
    cols: dict[str, list[Any]] = {n: [] for n in schema.names}

    def take() -> Any:
        arrays = [pa.array(cols[f.name], type=f.type) for f in schema]
        for col in cols.values():
            col.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    for _, pos, req, crc_ok in walk(partition.path, partition.base_offset, decode_properties=True):
        if req is None:
            row: dict[str, Any] = dict.fromkeys(cols)
            row.update(commitlog_offset=partition.base_offset + pos, size=-1, crc_ok=False, file=name)
        else:
            row = _dispatch_row(req, crc_ok, name)
        for k, v in row.items():
            cols[k].append(v)
        if len(cols["size"]) >= ROWS_PER_BATCH:
            yield take()
    if cols["size"]:
        yield take()


def _dispatch_row(req: DispatchRequest, crc_ok: bool, file: str) -> dict[str, Any]:
    return {
        "commitlog_offset": req.commit_log_offset,
        "size": req.msg_size,
        "topic": req.topic,
        "queue_id": req.queue_id,
        "queue_offset": req.consume_queue_offset,
        "sys_flag": req.sys_flag,
        "born_timestamp": req.born_timestamp,
        "store_timestamp": req.store_timestamp,
        "prepared_offset": req.prepared_transaction_offset,
        "tags": req.tags,
        "tags_code": req.tags_code,
        "keys": req.keys or [],
        "uniq_key": req.uniq_key,
        "crc_ok": crc_ok,
        "file": file,
    }


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
        list(row["keys"] or []) or None,
        row["uniq_key"],
    )
