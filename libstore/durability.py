"""Durability classes: which messages of a batch are transient, and their stub records.

A message is *persistent* (the default: its record is written to the CommitLog, flushed and
replicated as the store's policies say) or *transient* (RabbitMQ's delivery mode 1: its record
is held in memory by :class:`~libstore.transient_messages.TransientMessageStore`, never flushed,
never replicated, never waited for, and gone after a restart or a failover). A message is
transient when its topic's ``durability`` attribute is ``transient``
(:class:`~libstore.topic_config.TopicConfig`), or when its ``DURABILITY`` property (RabbitMQ's
delivery mode: ``1`` transient, ``2`` persistent) is ``1``: the property may lower a topic's
durability, never raise it. Records of the store's system topics (timer, transactions, pop
journal, quarantine) and transaction PREPARED/ROLLBACK records are always persistent: a delayed
or transactional message is kept until it is delivered to its topic, and the delivered copy
takes the message's durability.

What the CommitLog gets for a transient message is a *stub*: the same record (same header,
topic, queue, born time and host, so the same physical offset, queue offset and store time)
with an empty body, only the properties dispatch and the index read (TAGS, KEYS, UNIQ_KEY), and
SYSFLAG bit ``TRANSIENT_STUB_FLAG`` (0x100000, mqstore's, refused from producers). Dispatch,
ConsumeQueues, IndexFiles, pop state and replication handle stubs like any record; readers of
message content (CommitLog.read_many) find the whole record in the TransientMessageStore by the
stub's offset, or nothing: the message is removed, as a record retention deleted.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

from libstore.errors import MessageIllegalError
from libstore.message import MessageConst, MessageSysFlag
from libstore.record_codec import (
    PHY_OFFSET_POSITION,
    QUEUE_OFFSET_POSITION,
    SYS_FLAG_POSITION,
    EncodedBatch,
    bytes_to_properties,
    native,
    record_parts,
    record_size_of,
)
from libstore.system_topics import is_system_topic

TRANSIENT = "1"  # DURABILITY values: RabbitMQ's delivery modes
PERSISTENT = "2"
_STUB_PREFIXES: Final = tuple(
    name.encode() + b"\x01" for name in (MessageConst.TAGS, MessageConst.KEYS, MessageConst.UNIQ_KEY)
)
# The SYSFLAG byte that holds TRANSIENT_STUB_FLAG (a big-endian int32 at SYS_FLAG_POSITION), and
# the bit in it: readers test one byte of a record.
STUB_FLAG_BYTE: Final = SYS_FLAG_POSITION + 1
STUB_FLAG_BIT: Final = MessageSysFlag.TRANSIENT_STUB_FLAG >> 16
# What a stub's SYSFLAG keeps: the host layout and the transaction type (its body is empty, so
# never compressed).
_STUB_KEPT_FLAGS: Final = (
    MessageSysFlag.BORNHOST_V6_FLAG
    | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
    | MessageSysFlag.TRANSACTION_TYPE_MASK
    | MessageSysFlag.MULTI_TAGS_FLAG
)


class Durability(enum.Enum):
    """A topic's durability attribute (module doc)."""

    PERSISTENT = "persistent"
    TRANSIENT = "transient"


def is_transient_value(value: str | None) -> bool:
    """Whether a DURABILITY property value asks for a transient message: ``"1"`` yes, ``"2"``
    or absent no. Raises MessageIllegalError for any other value (a typo must not silently
    make a message persistent or transient)."""
    if value is None or value == PERSISTENT:
        return False
    if value == TRANSIENT:
        return True
    raise MessageIllegalError(
        f"property {MessageConst.DURABILITY} must be {TRANSIENT} (transient) or {PERSISTENT} "
        f"(persistent), got {value[:40]!r}"
    )


def is_transient_message(
    topic: str, properties: Mapping[str, str] | None, transient_topics: frozenset[str]
) -> bool:
    """Whether a message of ``topic`` with ``properties`` is transient (module doc), for a
    message the store took before (a value the store would refuse reads as persistent)."""
    if topic in transient_topics:
        return True
    value = properties.get(MessageConst.DURABILITY) if properties else None
    return value == TRANSIENT and not is_system_topic(topic)


def is_stub(record: bytes | bytearray | memoryview) -> bool:
    """Whether ``record`` (a whole record, at least 40 bytes) is a transient message's stub."""
    return bool(record[STUB_FLAG_BYTE] & STUB_FLAG_BIT)


def _sys_flag(record: bytes | bytearray) -> int:
    return int.from_bytes(record[SYS_FLAG_POSITION : SYS_FLAG_POSITION + 4], "big", signed=True)


def stub_properties(raw: bytes | bytearray) -> bytes:
    """The entries of serialized properties ``raw`` that a stub keeps (TAGS, KEYS, UNIQ_KEY),
    as they are, in their order."""
    return b"".join([e + b"\x02" for e in bytes(raw).split(b"\x02") if e.startswith(_STUB_PREFIXES)])


def stub_of(buf: bytearray, pos: int) -> bytes:
    """The stub record (module doc) of the encoded record at ``pos``."""
    body_at, body_len, props_at, end = record_parts(buf, pos)
    kept = stub_properties(buf[props_at:end])
    stub = bytearray(buf[pos:body_at])  # the fixed header, BODYLEN last
    stub[8:12] = b"\0\0\0\0"  # BODYCRC of the empty body
    sys_flag = (_sys_flag(stub) & _STUB_KEPT_FLAGS) | MessageSysFlag.TRANSIENT_STUB_FLAG
    stub[SYS_FLAG_POSITION : SYS_FLAG_POSITION + 4] = sys_flag.to_bytes(4, "big", signed=True)
    stub[-4:] = b"\0\0\0\0"  # BODYLEN
    stub += buf[body_at + body_len : props_at - 2]  # TOPICLEN, TOPIC
    stub += len(kept).to_bytes(2, "big")
    stub += kept
    stub[0:4] = len(stub).to_bytes(4, "big")
    return bytes(stub)


def make_stubs(buf: bytearray, positions: list[int], sizes: list[int], found: list[int]) -> bytearray:
    """A new buffer of ``buf``'s records (a batch's) with each record of ``found`` (ascending
    indexes) replaced by its stub; ``positions`` and ``sizes`` are updated in place, ``buf`` is
    left as it is. In C when the extension is built (libstore._codec.make_stubs)."""
    ext = native()
    if ext is not None:
        flag = MessageSysFlag.TRANSIENT_STUB_FLAG
        out = ext.make_stubs(buf, positions, sizes, found, flag, _STUB_KEPT_FLAGS)
        if out is not NotImplemented:
            return out  # type: ignore[no-any-return]
    return _make_stubs_py(buf, positions, sizes, found)


def _make_stubs_py(buf: bytearray, positions: list[int], sizes: list[int], found: list[int]) -> bytearray:
    parts: list[bytes | memoryview] = []
    done = 0
    with memoryview(buf) as view:
        for i in found:
            pos, size = positions[i], sizes[i]
            parts.append(view[done:pos])
            stub = stub_of(buf, pos)
            parts.append(stub)
            sizes[i] = len(stub)
            done = pos + size
        parts.append(view[done:])
        out = bytearray().join(parts)
    pos = 0
    for i, size in enumerate(sizes):
        positions[i] = pos
        pos += size
    positions[len(sizes)] = pos
    return out


def hold_entries(
    batch: EncodedBatch, start: int, stop: int, delta: int
) -> tuple[list[int], list[int], bytes]:
    """The stub offsets of ``batch``'s transient messages among records ``start``..``stop``-1,
    whose stubs just took their offsets (the put lock's loop, CommitLog._append_locked: the stub
    at position p of ``batch.buf`` is at CommitLog offset p + ``delta``), and their whole
    records one after another in one buffer, as ``(keys, ends, data)`` (record i of ``data``
    ends at ``ends[i]``: TransientMessageStore.put_run). Each whole record gets its stub's
    QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP. In C when the extension is built
    (libstore._codec.hold_entries)."""
    buf, positions, ts_positions = batch.buf, batch.positions, batch.store_ts_positions
    ext = native()
    if ext is not None:
        return ext.hold_entries(  # type: ignore[no-any-return]
            buf, positions, ts_positions, batch.whole_buf, batch.transient, start, stop, delta
        )
    keys: list[int] = []
    ends: list[int] = []
    data = bytearray()
    whole = batch.whole_buf
    for k, at in batch.transient.items():
        if not start <= k < stop:
            continue
        record = bytearray(whole[at : at + record_size_of(whole, at)])
        pos, ts = positions[k], ts_positions[k]
        record[QUEUE_OFFSET_POSITION : PHY_OFFSET_POSITION + 8] = buf[
            pos + QUEUE_OFFSET_POSITION : pos + PHY_OFFSET_POSITION + 8
        ]
        record[ts : ts + 8] = buf[pos + ts : pos + ts + 8]
        keys.append(pos + delta)
        data += record
        ends.append(len(data))
    return keys, ends, bytes(data)


def mark_transient(batch: EncodedBatch, transient_topics: frozenset[str]) -> None:
    """Find the transient messages of ``batch`` (module doc) and make them stubs, in place:
    ``batch.buf`` becomes a new buffer in which each one's stub takes its place, the records
    as encoded stay in ``batch.whole_buf``, ``batch.transient`` maps each one's index to where
    its whole record starts there, and the index joins ``batch.no_wait`` (a transient message
    is never waited for). Only records the encoder marked as carrying a DURABILITY
    property (``batch.durability_marked``) have their properties read. Raises
    MessageIllegalError (naming the record) for a DURABILITY value that is neither 1 nor 2;
    the batch is unchanged then."""
    buf = batch.buf
    marked = batch.durability_marked
    if not marked and not transient_topics:
        return
    keys = batch.queue_keys
    # The store's own topics are never in transient_topics (TopicConfigManager refuses that).
    found = [i for i, key in enumerate(keys) if key is not None and key[0] in transient_topics]
    if marked:
        by_topic = set(found)
        for i in marked:
            key = keys[i]
            if key is None or i in by_topic or is_system_topic(key[0]):
                continue  # tx PREPARED/ROLLBACK, the store's own topics: persistent
            _, _, props_at, end = record_parts(buf, batch.positions[i])
            try:
                value = bytes_to_properties(buf[props_at:end]).get(MessageConst.DURABILITY)
                transient = is_transient_value(value)
            except MessageIllegalError as exc:
                raise MessageIllegalError(f"message {i}: {exc}") from None
            if transient:
                found.append(i)
        found.sort()
    if not found:
        return
    positions = batch.positions
    whole_at = [positions[i] for i in found]
    batch.whole_buf = buf
    batch.buf = make_stubs(buf, positions, batch.sizes, found)
    batch.transient = dict(zip(found, whole_at, strict=True))
    stubs = sum(batch.sizes[i] for i in found)
    batch.transient_bytes = len(buf) - len(batch.buf) + stubs
    if batch.requests:  # adopted records: dispatch takes the stubs' sizes and flags
        sizes, requests = batch.sizes, batch.requests
        for i in found:
            req = requests[i]
            req.msg_size = sizes[i]
            req.sys_flag = (req.sys_flag & _STUB_KEPT_FLAGS) | MessageSysFlag.TRANSIENT_STUB_FLAG
    if batch.no_wait:
        batch.no_wait = sorted(set(batch.no_wait).union(found))
    else:
        batch.no_wait = found
