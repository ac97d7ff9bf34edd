"""Spark rows for stored messages: the schemas the data sources declare and Arrow record batches
that match them exactly (Spark checks the batch schema with ``equals``: int → int32, long →
int64, binary → binary, timestamp → timestamp[us, UTC], map<string,string> → map<string,string>;
spec sheet pyspark-datasource §3 "Arrow return").

Rows are built column by column from decoded CommitLog records (libstore.record_codec), so no
Python object per field goes through Spark's converters.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from libstore.message import MessageRecord

_TOPIC, _QUEUE_ID, _QUEUE_OFFSET, _PHY_OFFSET, _BODY, _TOTAL_SIZE = map(
    attrgetter, ("topic", "queue_id", "queue_offset", "phy_offset", "body", "total_size")
)

MESSAGE_SCHEMA = (
    "topic string, queue_id int, queue_offset long, commitlog_offset long, msg_id string, tags string, "
    "keys array<string>, properties map<string,string>, body binary, born_timestamp timestamp, "
    "store_timestamp timestamp"
)
# The CommitLog-file reader adds where each record sits and whether it checked out.
FILE_SCHEMA = MESSAGE_SCHEMA + ", size int, crc_ok boolean, file string"

ROWS_PER_BATCH = 4096


def arrow_schema(with_file: bool = False) -> Any:
    """The pyarrow schema of MESSAGE_SCHEMA (or FILE_SCHEMA)."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    fields = [
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("commitlog_offset", pa.int64()),
        ("msg_id", pa.string()),
        ("tags", pa.string()),
        ("keys", pa.list_(pa.string())),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
        ("born_timestamp", ts),
        ("store_timestamp", ts),
    ]
    if with_file:
        fields += [("size", pa.int32()), ("crc_ok", pa.bool_()), ("file", pa.string())]
    return pa.schema(fields)


class BatchBuilder:
    """Collects records column-wise; :meth:`take` returns a pyarrow RecordBatch of them."""

    def __init__(self, with_file: bool = False) -> None:
        self.with_file = with_file
        self.schema = arrow_schema(with_file)
        self._cols: dict[str, list[Any]] = {name: [] for name in self.schema.names}

    def __len__(self) -> int:
        return len(self._cols["topic"])

    def add(self, rec: MessageRecord, *, crc_ok: bool = True, file: str = "") -> None:
        """One record's row (see :meth:`extend`)."""
        self.extend((rec,), crc_ok=crc_ok, file=file)

    def extend(self, records: Sequence[MessageRecord], *, crc_ok: bool = True, file: str = "") -> None:
        """Rows for ``records``, column by column; a ``with_file`` builder also notes each one's
        size, ``crc_ok`` and ``file``."""
        c = self._cols
        c["topic"] += map(_TOPIC, records)
        c["queue_id"] += map(_QUEUE_ID, records)
        c["queue_offset"] += map(_QUEUE_OFFSET, records)
        c["commitlog_offset"] += map(_PHY_OFFSET, records)
        c["msg_id"] += [rec.uniq_key or rec.msg_id for rec in records]
        c["tags"] += [rec.tags for rec in records]
        c["keys"] += [rec.keys for rec in records]
        c["properties"] += [list(rec.properties.items()) for rec in records]
        c["body"] += map(_BODY, records)
        c["born_timestamp"] += [rec.born_timestamp * 1000 for rec in records]
        c["store_timestamp"] += [rec.store_timestamp * 1000 for rec in records]
        if self.with_file:
            c["size"] += map(_TOTAL_SIZE, records)
            c["crc_ok"] += [crc_ok] * len(records)
            c["file"] += [file] * len(records)

    def add_unreadable(self, phy_offset: int, file: str) -> None:
        """A position whose bytes are not a record (only with ``with_file``): nulls but the
        offset, size -1 and crc_ok False."""
        for col in self._cols.values():
            col.append(None)
        self._cols["commitlog_offset"][-1] = phy_offset
        self._cols["size"][-1] = -1
        self._cols["crc_ok"][-1] = False
        self._cols["file"][-1] = file

    def take(self) -> Any:
        import pyarrow as pa

        arrays = [pa.array(self._cols[f.name], type=f.type) for f in self.schema]
        self._cols = {name: [] for name in self.schema.names}
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
