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
from array import array
from collections.abc import Mapping
from itertools import pairwise
from typing import Any, Final

from libstore.errors import MessageIllegalError
from libstore.message import MessageConst, MessageSysFlag
from libstore.record_codec import (
    PHY_OFFSET_POSITION,
    QUEUE_OFFSET_POSITION,
    SYS_FLAG_POSITION,
    bytes_to_properties,
    native,
    record_parts,
    record_size_of,
)
from libstore.record_encoder import EncodedBatch
from libstore.system_topics import SYSTEM_TOPICS, is_system_topic

TRANSIENT = "1"  # DURABILITY values: RabbitMQ's delivery modes
PERSISTENT = "2"
# hold_entries: a batch's transient records of at least this many bytes (all of the request) are
# held as a view of the request's buffer; smaller ones are copied, which costs less than the
# view (a one-message put's record: measured 2026-11-28, see bench/README's services notes).
HOLD_VIEW_MIN_BYTES: Final = 8192
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


# What splitting a batch gives: the stub buffer, the transient messages' indexes, where each
# one's whole record starts in the batch's buffer as it was ({index: position}, in record
# order), and their bytes (mark_transient).
_Split = tuple[bytearray, list[int], dict[int, int], int]


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


def hold_entries(
    batch: EncodedBatch, start: int, stop: int, delta: int, min_view_bytes: int = HOLD_VIEW_MIN_BYTES
) -> tuple[array[int], array[int], bytes | memoryview]:
    """The stub offsets of ``batch``'s transient messages among records ``start``..``stop``-1,
    whose stubs just took their offsets (the put lock's loop, CommitLog._append_locked: the stub
    at position p of ``batch.buf`` is at CommitLog offset p + ``delta``), and their whole
    records one after another, as ``(keys, ends, data)`` (record i of ``data`` ends at
    ``ends[i]``; keys and ends are array('q'), ascending: TransientMessageStore.put_run). Each
    whole record gets its stub's QUEUEOFFSET,
    PHYSICALOFFSET and STORETIMESTAMP. When the records are all of ``batch.whole_buf`` (a batch
    of transient messages only, in one run) and at least ``min_view_bytes`` long, they are
    patched there and ``data`` is a read-only view of it (no copy: the store's count of held
    bytes is then all the view keeps alive); else ``data`` is new bytes (a small batch: a copy
    costs less than the view). In C when the
    extension is built (libstore._codec.hold_entries)."""
    buf, positions, ts_positions = batch.buf, batch.positions, batch.store_ts_positions
    ext = native()
    if ext is not None:
        return ext.hold_entries(  # type: ignore[no-any-return]
            buf, positions, ts_positions, batch.whole_buf, batch.transient, start, stop, delta, min_view_bytes
        )
    whole = batch.whole_buf
    held = [(k, at, record_size_of(whole, at)) for k, at in batch.transient.items() if start <= k < stop]
    # A view keeps all of whole_buf alive and the store counts only what it holds: in place
    # only when the records are the whole buffer.
    in_place = (
        bool(held)
        and held[0][1] == 0
        and sum(size for _, _, size in held) == len(whole) >= min_view_bytes
        and all(a[1] + a[2] == b[1] for a, b in pairwise(held))
    )
    keys = array("q")
    ends = array("q")
    copied = bytearray()
    end = 0
    for k, at, size in held:
        record = whole if in_place else bytearray(whole[at : at + size])
        base = at if in_place else 0
        pos, ts = positions[k], ts_positions[k]
        record[base + QUEUE_OFFSET_POSITION : base + PHY_OFFSET_POSITION + 8] = buf[
            pos + QUEUE_OFFSET_POSITION : pos + PHY_OFFSET_POSITION + 8
        ]
        record[base + ts : base + ts + 8] = buf[pos + ts : pos + ts + 8]
        if not in_place:
            copied += record
        keys.append(pos + delta)
        end += size
        ends.append(end)
    if in_place:
        first = held[0][1]
        return keys, ends, memoryview(whole)[first : first + end].toreadonly()
    return keys, ends, bytes(copied)


def mark_transient(batch: EncodedBatch, transient_topics: frozenset[str]) -> None:
    """Find the transient messages of ``batch`` (module doc) and make them stubs, in place:
    ``batch.buf`` becomes a new buffer in which each one's stub takes its place, the buffer as
    it was becomes ``batch.whole_buf`` (the transient records' bytes: ``batch.transient_bytes``),
    ``batch.transient`` maps each one's index to where its whole record starts there, and the
    index joins ``batch.no_wait`` (a transient message is never waited for). Only records the
    encoder marked as carrying a DURABILITY property (``batch.durability_marked``) have their
    properties read. Raises MessageIllegalError (naming the record) for a DURABILITY value that
    is neither 1 nor 2; the batch is unchanged then. One pass in C when the extension is built
    (libstore._codec.split_transient)."""
    if not batch.durability_marked and not transient_topics:
        return
    ext = native()
    native_split: Any = NotImplemented  # the C split, NotImplemented where it cannot
    if ext is not None:
        native_split = ext.split_transient(
            batch.buf,
            batch.positions,
            batch.sizes,
            batch.queue_keys,
            transient_topics,
            batch.durability_marked,
            SYSTEM_TOPICS,
            batch.requests,
            MessageSysFlag.TRANSIENT_STUB_FLAG,
            _STUB_KEPT_FLAGS,
        )
    split: _Split | None
    if native_split is NotImplemented or isinstance(native_split, int):
        # The Python code splits, or words the refusal of a bad DURABILITY value (C's int).
        split = _split_py(batch, _find_transient(batch, transient_topics))
    else:
        split = native_split
    if split is None:
        return
    batch.whole_buf = batch.buf
    batch.buf, found, batch.transient, batch.transient_bytes = split
    if batch.no_wait:
        batch.no_wait = sorted(set(batch.no_wait).union(found))
    else:
        batch.no_wait = found


def _find_transient(batch: EncodedBatch, transient_topics: frozenset[str]) -> list[int]:
    """The indexes of ``batch``'s transient messages, ascending (mark_transient's rules);
    raises MessageIllegalError for a bad DURABILITY value."""
    keys = batch.queue_keys
    # The store's own topics are never in transient_topics (TopicConfigManager refuses that).
    found = [i for i, key in enumerate(keys) if key is not None and key[0] in transient_topics]
    by_topic = set(found)
    for i in batch.durability_marked:
        key = keys[i]
        if key is None or i in by_topic or is_system_topic(key[0]):
            continue  # tx PREPARED/ROLLBACK, the store's own topics: persistent
        _, _, props_at, end = record_parts(batch.buf, batch.positions[i])
        try:
            value = bytes_to_properties(batch.buf[props_at:end]).get(MessageConst.DURABILITY)
            transient = is_transient_value(value)
        except MessageIllegalError as exc:
            raise MessageIllegalError(f"message {i}: {exc}") from None
        if transient:
            found.append(i)
    return sorted(found)


def _split_py(batch: EncodedBatch, found: list[int]) -> _Split | None:
    """libstore._codec.split_transient's work for the records ``found``: the stub buffer,
    ``found``, where each whole record starts in ``batch.buf`` and their bytes; ``positions``,
    ``sizes`` and the requests are updated in place. None when ``found`` is empty."""
    if not found:
        return None
    buf, positions, sizes = batch.buf, batch.positions, batch.sizes
    parts: list[bytes | memoryview] = []
    whole_at = {i: positions[i] for i in found}
    whole_bytes = sum(sizes[i] for i in found)
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
    if batch.requests:  # adopted records: dispatch takes the stubs' sizes and flags
        requests = batch.requests
        for i in found:
            req = requests[i]
            req.msg_size = sizes[i]
            req.sys_flag = (req.sys_flag & _STUB_KEPT_FLAGS) | MessageSysFlag.TRANSIENT_STUB_FLAG
    return out, found, whole_at, whole_bytes
