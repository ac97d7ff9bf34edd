"""CommitLog record codec, byte-compatible with Apache RocketMQ's v1/v2 record (spec sheet §1).

All integers are big-endian; strings UTF-8. One record (v1, IPv4 born and store hosts)::

    offset  field                 bytes
    ------  --------------------  -----
         0  TOTALSIZE             4     whole record, this field included
         4  MAGICCODE             4     v1 0xDAA320A7, v2 0xDAA320AB (2-byte topic length)
         8  BODYCRC               4     zlib.crc32(body) & 0x7FFFFFFF
        12  QUEUEID               4
        16  FLAG                  4     producer's opaque int
        20  QUEUEOFFSET           8     ConsumeQueue index; 0 for tx PREPARED/ROLLBACK
        28  PHYSICALOFFSET        8     CommitLog offset of this record
        36  SYSFLAG               4     MessageSysFlag bits
        40  BORNTIMESTAMP         8     ms
        48  BORNHOST              8     IPv4 + int32 port (20 with IPv6, SYSFLAG 0x10)
        56  STORETIMESTAMP        8     ms, set under the put lock
        64  STOREHOST             8     (20 with IPv6, SYSFLAG 0x20)
        72  RECONSUMETIMES        4
        76  PREPARED_TX_OFFSET    8
        84  BODYLEN               4
        88  BODY                  BODYLEN
            TOPICLEN              1 (v1) / 2 (v2)
            TOPIC                 TOPICLEN
            PROPLEN               2 (signed)
            PROPERTIES            PROPLEN: key \\x01 value \\x02 per entry

Fixed overhead 91 bytes (v1, IPv4 + IPv4); +1 for v2; +12 per IPv6 host. A file that cannot
hold the next record (record + 8 > free bytes) ends with an 8-byte blank: int32 free bytes, int32
BLANK_MAGIC_CODE; readers skip to the next file.

This module holds the layout: its constants, checking records (into a
libstore.dispatch_request.DispatchRequest) and decoding them. Encoding is
libstore.record_encoder's. Everything here is a pure function.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

from libstore.dispatch_request import DispatchRequest
from libstore.errors import (
    CorruptRecordError,
    IllegalTopicError,
    MessageIllegalError,
    PropertiesSizeExceededError,
)
from libstore.message import (
    MessageConst,
    MessageRecord,
    MessageSysFlag,
)
from libstore.message_id import create_message_id, decode_host
from libstore.system_topics import SYSTEM_CODE_PROPERTIES, SYSTEM_TOPICS, system_tags_code
from libstore.tags import tags_code as compute_tags_code

try:  # ISA-L's CRC-32 is the same function as zlib's (java.util.zip.CRC32), about 3x faster per KiB.
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - platforms without an isal wheel
    from zlib import crc32 as _crc32

body_crc32 = _crc32  # BODYCRC is body_crc32(body) & 0x7FFFFFFF (the encoder computes it too)

# The hot loops in C (libstore/_codec.c, built by `make install`); these pure-Python functions
# are the reference it is tested against and the fallback without it (or with MQSTORE_PURE_PYTHON=1).
_ext: Any = None
if not os.environ.get("MQSTORE_PURE_PYTHON"):
    try:
        _ext = importlib.import_module("libstore._codec")  # no type information: a C module
    except ImportError:  # pragma: no cover - a build without the C compiler
        _ext = None


def native() -> Any:
    """libstore._codec when it is built and in use, else None (MQSTORE_PURE_PYTHON=1, or no
    C compiler at install). Other modules' hot loops (IndexFile) take their C versions from it
    too, so one switch (and the tests' pure-Python mode) covers them all."""
    return _ext


# Where the fixed header's fields start (bytes into a record; the drawing above). Past the born
# host the positions depend on the hosts' widths (SYSFLAG): _STORE_TS_POSITION.
QUEUE_ID_POSITION: Final = 12
QUEUE_OFFSET_POSITION: Final = 20
PHY_OFFSET_POSITION: Final = 28
SYS_FLAG_POSITION: Final = 36
BORN_TIMESTAMP_POSITION: Final = 40
BORN_HOST_POSITION: Final = 48
STORE_TIMESTAMP_POSITION_V4: Final = 56  # with an IPv4 born host

MESSAGE_MAGIC_CODE: Final = -626843481  # 0xDAA320A7, v1
MESSAGE_MAGIC_CODE_V2: Final = -626843477  # 0xDAA320AB, v2: 2-byte topic length
BLANK_MAGIC_CODE: Final = -875286124  # 0xCBD43194, end-of-file blank
END_FILE_MIN_BLANK_LENGTH: Final = 8
NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"
MAX_PROPERTIES_LENGTH: Final = 32767
MAX_TOPIC_LENGTH_V2: Final = 255  # RocketMQ rejects any topic over 255 bytes
RECORD_OVERHEAD_V1_IPV4: Final = 91

_TOTAL_MAGIC = struct.Struct(">ii")
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")
# QUEUEOFFSET + PHYSICALOFFSET (at QUEUE_OFFSET_POSITION) and STORETIMESTAMP: patched under the put lock.
QUEUE_OFFSET_AND_PHY_OFFSET: Final = struct.Struct(">qq")
STORE_TIMESTAMP: Final = struct.Struct(">q")

_HOST_V6_FLAGS = MessageSysFlag.BORNHOST_V6_FLAG | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
_TOPIC_RE = re.compile(r"[%|a-zA-Z0-9_-]+")
_SYSTEM_TOPIC_PREFIXES = ("%RETRY%", "%DLQ%")
_WAIT_ENTRY = MessageConst.WAIT.encode() + b"\x01"  # a WAIT property in serialized properties
_DURABILITY_ENTRY = MessageConst.DURABILITY.encode() + b"\x01"


def _header_struct(born_len: int, store_len: int) -> struct.Struct:
    return struct.Struct(f">iiiiiqqiq{born_len}sq{store_len}siqi")


# Whole fixed header up to and including BODYLEN, per (born host, store host) size.
_HEADERS = {(b, s): _header_struct(b, s) for b in (8, 20) for s in (8, 20)}
_HEADER_V4_V4 = _HEADERS[(8, 8)]


def _header_for(sys_flag: int) -> struct.Struct:
    """The fixed-header struct (TOTALSIZE .. BODYLEN) of a record with this SYSFLAG."""
    if not sys_flag & _HOST_V6_FLAGS:
        return _HEADER_V4_V4
    return _HEADERS[
        (
            20 if sys_flag & MessageSysFlag.BORNHOST_V6_FLAG else 8,
            20 if sys_flag & MessageSysFlag.STOREHOSTADDRESS_V6_FLAG else 8,
        )
    ]


def encode_blank(max_blank: int) -> bytes:
    """The 8-byte end-of-file blank record: int32 ``max_blank`` (free bytes), int32 BLANK_MAGIC_CODE."""
    return _TOTAL_MAGIC.pack(max_blank, BLANK_MAGIC_CODE)


def properties_to_bytes(properties: Mapping[str, str] | None) -> bytes:
    """Serialize properties as RocketMQ does: ``key \\x01 value \\x02`` per entry, UTF-8.

    Raises MessageIllegalError when a key or value is not a str, a key is empty, or either
    contains a separator; PropertiesSizeExceededError when the result exceeds 32767 bytes.
    """
    if not properties:
        return b""
    try:
        if len(properties) == 1:
            ((k, v),) = properties.items()
            text = k + "\x01" + v + "\x02"  # literals: this runs once per message
        else:
            text = "".join([k + "\x01" + v + "\x02" for k, v in properties.items()])
    except TypeError as exc:
        raise MessageIllegalError("property keys and values must be str") from exc
    n = len(properties)
    if text.count("\x01") != n or text.count("\x02") != n:
        raise MessageIllegalError("property keys and values must not contain \\x01 or \\x02")
    if "" in properties:
        raise MessageIllegalError("property keys must not be empty")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MessageIllegalError(f"properties are not encodable as UTF-8: {exc.reason}") from None
    if len(raw) > MAX_PROPERTIES_LENGTH:
        raise PropertiesSizeExceededError(
            f"serialized properties are {len(raw)} bytes, the limit is {MAX_PROPERTIES_LENGTH}"
        )
    return raw


def _properties_look_written(raw: bytes) -> bool:
    """The cheap shape check recovery makes (see :func:`check_record`)."""
    if not raw.endswith(b"\x02") or b"\x00" in raw:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _properties_problem(raw: bytes) -> str | None:
    """Why serialized properties could not have come from :func:`properties_to_bytes` (not
    UTF-8, an entry that is not ``name \\x01 value \\x02``, an empty name), or None."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "properties are not valid UTF-8"
    if not text.endswith(PROPERTY_SEPARATOR):
        return "properties must be name \\x01 value \\x02 entries"
    for entry in text[:-1].split(PROPERTY_SEPARATOR):
        if entry.count(NAME_VALUE_SEPARATOR) != 1:
            return "properties must be name \\x01 value \\x02 entries"
        if entry.startswith(NAME_VALUE_SEPARATOR):
            return "property names must not be empty"
    return None


def bytes_to_properties(raw: bytes | bytearray | memoryview) -> dict[str, str]:
    """Parse serialized properties as RocketMQ does (spec §1).

    Splits on ``\\x02``, skips pieces shorter than 3 characters, splits each at the first
    ``\\x01``, drops entries with an empty key or value. Malformed UTF-8 is replaced, as Java does.
    """
    out: dict[str, str] = {}
    if not raw:
        return out
    for piece in bytes(raw).decode("utf-8", "replace").split(PROPERTY_SEPARATOR):
        if len(piece) < 3:
            continue
        key, sep, value = piece.partition(NAME_VALUE_SEPARATOR)
        if sep and key and value:
            out[key] = value
    return out


def validate_topic(topic: str, max_length: int = 127) -> bytes:
    """Check a topic name and return its UTF-8 bytes.

    Rules: non-empty; only ``[A-Za-z0-9_%|-]``; at most ``max_length`` bytes, or 255 for
    ``%RETRY%``/``%DLQ%`` system topics. Raises IllegalTopicError.
    """
    if not isinstance(topic, str) or not topic:
        raise IllegalTopicError("topic must be a non-empty string")
    if not _TOPIC_RE.fullmatch(topic):
        raise IllegalTopicError(f"topic {topic!r} has characters outside [A-Za-z0-9_%|-]")
    limit = MAX_TOPIC_LENGTH_V2 if topic.startswith(_SYSTEM_TOPIC_PREFIXES) else max_length
    raw = topic.encode("ascii")
    if len(raw) > min(limit, MAX_TOPIC_LENGTH_V2):
        raise IllegalTopicError(f"topic is {len(raw)} bytes, the limit is {min(limit, MAX_TOPIC_LENGTH_V2)}")
    return raw


# STORETIMESTAMP position inside a record, by the born host's width: right after it.
_STORE_TS_POSITION = {8: BORN_HOST_POSITION + 8, 20: BORN_HOST_POSITION + 20}


# The properties dispatch reads (TAGS, KEYS, UNIQ_KEY; for system topics the number their units
# carry, libstore.system_topics) and those that schedule a message, found in one pass: a name at
# the start or after a \x02, then \x01, then the value up to the next \x02 (RocketMQ's parse;
# the last one wins).
_DISPATCH_PROPERTIES = re.compile(
    rb"(?:^|\x02)(TAGS|KEYS|UNIQ_KEY|DELAY|TIMER_DELIVER_MS|TIMER_DELAY_SEC|TIMER_DELAY_MS"
    rb"|TRAN_HALF_OFFSET|TIMER_UNIT|POP_SEQ|traceparent)\x01([^\x02]*)"
)
# Properties that may schedule a message (libstore.scheduled_message): flagged while validating.
_SCHEDULING = frozenset({b"DELAY", b"TIMER_DELIVER_MS", b"TIMER_DELAY_SEC", b"TIMER_DELAY_MS"})
_NOTHING: dict[bytes, bytes] = {}
_TOPIC_NAMES: dict[bytes, str] = {}


def _topic_name(raw: bytes) -> str:
    """Decoded topic name, cached (a log holds few topics). Raises UnicodeDecodeError."""
    name = _TOPIC_NAMES.get(raw)
    if name is None:
        name = raw.decode("utf-8")
        if len(_TOPIC_NAMES) > 10_000:
            _TOPIC_NAMES.clear()
        _TOPIC_NAMES[raw] = name
    return name


def check_record(
    buf: Any,
    pos: int,
    limit: int,
    *,
    check_crc: bool = True,
    expected_phy_offset: int = -1,
    decode_properties: bool = True,
) -> DispatchRequest:
    """Validate the record at ``buf[pos:]`` and return what dispatch and recovery need (spec §1).

    With ``decode_properties`` the TAGS, KEYS and UNIQ_KEY properties are read and the delay and
    timer ones noticed (the rest are not parsed: dispatch needs only these).

    ``buf`` is any bytes-like object (bytes, bytearray, mmap); ``limit`` the end of the readable
    bytes in it. Checks: room for a header, magic (blank → size 0), TOTALSIZE within ``limit``,
    body CRC (when ``check_crc``), PHYSICALOFFSET equal to ``expected_phy_offset`` (when ≥ 0),
    the length recomputed from BODYLEN/TOPICLEN/PROPLEN equal to TOTALSIZE, and (when
    ``check_crc``) properties that could have been written: UTF-8 ending in ``\\x02`` with no
    NUL byte. The body CRC covers only the body; the properties check catches the record torn
    in a power loss whose tail (properties only) reads back as zeros or garbage, which would
    otherwise pass. Never raises on bad bytes: returns ``success`` False instead. The record's
    offset in the log is taken from its PHYSICALOFFSET field into ``commit_log_offset``.
    """
    return _check_record(
        buf, pos, limit, check_crc, expected_phy_offset, decode_properties, check_crc, False
    )[0]


def record_parts(buf: Any, pos: int) -> tuple[int, int, int, int]:
    """Where the parts of the record at ``buf[pos:]`` lie, as :func:`check_record` finds them
    (no CRC check): (body start, BODYLEN, properties start, record end), positions in ``buf``;
    the TOPICLEN field and topic run from body start + BODYLEN to properties start - 2. Raises
    CorruptRecordError when no record is there."""
    req, fields, body_at, props_at = _check_record(buf, pos, len(buf), False, -1, False)
    if not req.success or req.msg_size == 0:
        raise CorruptRecordError(f"no record at position {pos}")
    return body_at, fields[-1], props_at, pos + req.msg_size


_NO_FIELDS: tuple[Any, ...] = ()


def _check_record(
    buf: Any,
    pos: int,
    limit: int,
    check_crc: bool,
    expected_phy_offset: int,
    decode_properties: bool,
    check_properties: bool = False,
    want_fields: bool = True,
) -> tuple[DispatchRequest, tuple[Any, ...], int, int]:
    """:func:`check_record`, also returning what it unpacked for :func:`decode_record`: the
    fixed header's fields (TOTALSIZE .. BODYLEN; () unless ``want_fields``), where the body
    starts and where the properties start. For a blank or bad bytes: (request, (), -1, -1).
    Runs in C (libstore._codec) when the extension is built, else :func:`_check_record_py`."""
    if _ext is not None:
        out = _ext.check_record(
            buf, pos, limit, check_crc, expected_phy_offset, decode_properties, check_properties, want_fields
        )
        if out is not NotImplemented:
            return out  # type: ignore[no-any-return]
    return _check_record_py(
        buf, pos, limit, check_crc, expected_phy_offset, decode_properties, check_properties
    )


def _check_record_py(
    buf: Any,
    pos: int,
    limit: int,
    check_crc: bool,
    expected_phy_offset: int,
    decode_properties: bool,
    check_properties: bool = False,
) -> tuple[DispatchRequest, tuple[Any, ...], int, int]:
    """The reference :func:`_check_record` (fields always unpacked), in pure Python."""
    remaining = limit - pos
    if remaining < END_FILE_MIN_BLANK_LENGTH:
        return DispatchRequest(False, -1), _NO_FIELDS, -1, -1
    total, magic = _TOTAL_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return DispatchRequest(True, 0), _NO_FIELDS, -1, -1
    if magic == MESSAGE_MAGIC_CODE:
        topic_len_size = 1
    elif magic == MESSAGE_MAGIC_CODE_V2:
        topic_len_size = 2
    else:
        return DispatchRequest(False, -1), _NO_FIELDS, -1, -1
    if total < RECORD_OVERHEAD_V1_IPV4 or total > remaining:
        return DispatchRequest(False, total), _NO_FIELDS, -1, -1
    # The common layout (IPv4 born and store hosts) in one call; redo for IPv6 hosts.
    header = _HEADER_V4_V4
    fields = header.unpack_from(buf, pos)
    sys_flag = fields[7]
    if sys_flag & _HOST_V6_FLAGS:
        header = _header_for(sys_flag)
        if header.size > total:
            return DispatchRequest(False, total), _NO_FIELDS, -1, -1
        fields = header.unpack_from(buf, pos)
    (
        _,
        _,
        body_crc,
        queue_id,
        _,
        queue_offset,
        phy_offset,
        _,
        born_ts,
        _,
        store_ts,
        _,
        _,
        prepared_tx,
        body_len,
    ) = fields
    if 0 <= expected_phy_offset != phy_offset:
        return DispatchRequest(False, total), _NO_FIELDS, -1, -1
    body_at = p = pos + header.size
    end = pos + total
    if body_len < 0 or p + body_len + topic_len_size + 2 > end:
        return DispatchRequest(False, total), _NO_FIELDS, -1, -1
    if check_crc and (_crc32(buf[p : p + body_len]) & 0x7FFFFFFF) != body_crc:
        return DispatchRequest(False, total), _NO_FIELDS, -1, -1
    p += body_len
    topic_len = buf[p] if topic_len_size == 1 else _SHORT.unpack_from(buf, p)[0]
    p += topic_len_size
    if topic_len <= 0 or p + topic_len + 2 > end:
        return DispatchRequest(False, total), _NO_FIELDS, -1, -1
    try:
        topic = _topic_name(bytes(buf[p : p + topic_len]))
    except UnicodeDecodeError:
        return DispatchRequest(False, total), _NO_FIELDS, -1, -1
    p += topic_len
    prop_len = _SHORT.unpack_from(buf, p)[0]
    p += 2
    if prop_len < 0 or p + prop_len != end:
        return DispatchRequest(False, total), _NO_FIELDS, -1, -1
    if check_properties and prop_len and not _properties_look_written(bytes(buf[p:end])):
        return DispatchRequest(False, total), _NO_FIELDS, -1, -1
    tags = uniq_key = trace_context = None
    code = 0
    keys: tuple[str, ...] = ()
    scheduled = False
    if decode_properties and prop_len:
        found = dict(_DISPATCH_PROPERTIES.findall(bytes(buf[p:end])))
        if found:
            raw_tags = found.get(b"TAGS")
            if raw_tags:
                tags = raw_tags.decode("utf-8", "replace")
                code = compute_tags_code(tags)
            raw_keys = found.get(b"KEYS")
            if raw_keys:
                text = raw_keys.decode("utf-8", "replace")
                parts = text.split(MessageConst.KEY_SEPARATOR) if " " in text else (text,)
                keys = tuple(k for k in parts if k)
            raw_uniq = found.get(b"UNIQ_KEY")
            if raw_uniq:
                uniq_key = raw_uniq.decode("utf-8", "replace")
            raw_trace = found.get(b"traceparent")
            if raw_trace:
                trace_context = raw_trace.decode("utf-8", "replace")
            scheduled = not _SCHEDULING.isdisjoint(found)
    if decode_properties and topic in SYSTEM_TOPICS:  # units carrying a time or an offset
        code = system_tags_code(topic, found if prop_len else _NOTHING, store_ts) or 0
    req = DispatchRequest(
        True,
        total,
        topic,
        queue_id,
        phy_offset,
        queue_offset,
        sys_flag,
        born_ts,
        store_ts,
        prepared_tx,
        tags,
        code,
        keys,
        uniq_key,
        scheduled,
        trace_context,
    )
    return req, fields, body_at, p


def record_topics(raw: bytes | bytearray | memoryview, max_records: int = 0) -> set[str]:
    """The topics of a run of records (the records form of Produce), read from their headers
    without checking CRCs, so a gateway can authorize a batch before the store validates it
    (libstore.record_encoder.RecordEncoder.adopt_records). Raises MessageIllegalError for bytes that do not
    split into whole records, or for more than ``max_records`` of them (0: no bound)."""
    topics: set[str] = set()
    pos, limit, count = 0, len(raw), 0
    while pos < limit:
        count += 1
        if max_records and count > max_records:
            raise MessageIllegalError(
                f"a request carries at most {max_records} records (maxMessagesPerRequest)"
            )
        req, _, _, _ = _check_record(raw, pos, limit, False, -1, False, False, False)
        if not req.success or req.msg_size <= 0:
            raise MessageIllegalError(f"bytes at {pos} are not a CommitLog record")
        topics.add(req.topic)
        pos += req.msg_size
    return topics


def decode_record(
    buf: Any, pos: int = 0, limit: int | None = None, *, check_crc: bool = True
) -> MessageRecord:
    """Decode the whole record at ``buf[pos:]`` into a MessageRecord (validated as
    :func:`check_record` validates, CRC included unless ``check_crc`` is False).

    Raises CorruptRecordError when the bytes are not a valid record (or are a blank).
    """
    end_limit = len(buf) if limit is None else limit
    if _ext is not None:
        record = _ext.decode_record(buf, pos, end_limit, check_crc)
        if record is not NotImplemented:
            return record  # type: ignore[no-any-return]
    check, fields, body_at, props_at = _check_record(buf, pos, end_limit, check_crc, -1, False)
    if not check.success or check.msg_size == 0:
        what = "a blank end-of-file record" if check.success else "not a valid record"
        raise CorruptRecordError(f"bytes at position {pos} are {what}")
    (
        total,
        magic,
        body_crc,
        queue_id,
        flag,
        queue_offset,
        phy_offset,
        sys_flag,
        born_ts,
        born_raw,
        store_ts,
        store_raw,
        reconsume,
        prepared_tx,
        body_len,
    ) = fields
    body = bytes(buf[body_at : body_at + body_len])
    end = pos + total
    properties = bytes_to_properties(buf[props_at:end]) if props_at < end else {}
    return MessageRecord(  # positional, in MessageRecord's field order (cheaper per record)
        total,
        magic,
        body_crc,
        queue_id,
        flag,
        queue_offset,
        phy_offset,
        sys_flag,
        born_ts,
        _decoded_host(born_raw),
        store_ts,
        _decoded_host(store_raw),
        reconsume,
        prepared_tx,
        body,
        check.topic,
        properties,
        create_message_id(store_raw, phy_offset),
    )


def decode_records(raws: Sequence[bytes], *, check_crc: bool = True) -> list[MessageRecord]:
    """:func:`decode_record` of each of ``raws`` (one whole record each, as a pull returns
    them), in one C loop when the extension is built and ``raws`` is a list of bytes.

    The C decoder leaves its records out of the cyclic garbage collector (reference counting
    frees them): nothing a record holds can refer back to it, and tracked, the records a
    consumer keeps were walked by every collection (about 30% of decoding). A caller that sets
    a field to something referring back to its record must break that cycle itself.

    Raises CorruptRecordError for the first that is not a valid record (or is a blank).
    """
    if _ext is not None and type(raws) is list:
        records = _ext.decode_records(raws, check_crc)
        if records is not NotImplemented:
            return records  # type: ignore[no-any-return]
    return [decode_record(raw, check_crc=check_crc) for raw in raws]


@functools.lru_cache(maxsize=4096)
def _decoded_host(raw: bytes) -> tuple[str, int]:
    # Hosts repeat from record to record; the ipaddress module is slow to run each time.
    return decode_host(raw)


def record_size_of(buf: Any, pos: int) -> int:
    """TOTALSIZE of the record at ``pos`` (0 for a blank END record, -1 for anything else: an
    unknown magic, or a record magic with a TOTALSIZE that is not positive). Only the first 8
    bytes are read; whether the record fits where it is, the caller checks."""
    total: int
    magic: int
    total, magic = _TOTAL_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return 0
    if magic in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2) and total > 0:
        return total
    return -1


def _store_ts_position(sys_flag: int) -> int:
    """Where STORETIMESTAMP sits inside a record with this SYSFLAG (after the born host)."""
    return _STORE_TS_POSITION[20 if sys_flag & MessageSysFlag.BORNHOST_V6_FLAG else 8]


def store_timestamp_at(buf: Any, pos: int) -> int:
    """STORETIMESTAMP (ms) of the record at ``pos`` (its header must be in ``buf``)."""
    sys_flag = _INT.unpack_from(buf, pos + SYS_FLAG_POSITION)[0]
    timestamp: int = STORE_TIMESTAMP.unpack_from(buf, pos + _store_ts_position(sys_flag))[0]
    return timestamp


def native_crc32_address() -> int:
    """The address of ISA-L's ``crc32_gzip_refl`` (zlib's crc32 as a C function) in the isal
    wheel's module, for the C extension to call without going through Python (about 0.1 us a
    record less than calling isal_zlib.crc32 from C); 0 when isal is missing or does not export
    it. The extension checks it against zlib before using it (_codec.use_crc32)."""
    try:
        import ctypes

        from isal import isal_zlib

        function = ctypes.CDLL(isal_zlib.__file__).crc32_gzip_refl
    except (ImportError, OSError, AttributeError):
        return 0
    address: int | None = ctypes.cast(function, ctypes.c_void_p).value
    return address or 0


if _ext is not None:
    _ext.configure(DispatchRequest, SYSTEM_CODE_PROPERTIES, _crc32)
    _ext.use_crc32(native_crc32_address())
    _ext.configure_record(
        MessageRecord, tuple(f.name for f in dataclasses.fields(MessageRecord)), _decoded_host
    )
