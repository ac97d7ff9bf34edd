"""Records framed in protobuf's wire form, as a ``repeated bytes`` field, for replies that carry
many of them.

On the wire, each value of a ``repeated bytes`` field is a length-delimited field: the tag byte
(field number << 3 | 2), the length as a base-128 varint, the bytes (protobuf's encoding guide,
"Length-delimited records"). Fields may come in any order and a message's encoding may be
concatenated with more of its fields, so a reply whose bulk is records can be assembled from
the records framed here and its other fields encoded by protobuf: the records are copied once,
out of the log, and never go through a message object (services._common.wire builds the
replies; libstore.log_reads.read_records_framed frames straight out of the segments).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Literal, overload

WIRE_LENGTH_DELIMITED = 2


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf base-128 varint, least significant group first."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.lru_cache(maxsize=4096)
def field_header(tag: int, length: int) -> bytes:
    """The tag byte and length varint that precede a length-delimited value of ``length`` bytes
    (``tag`` < 128: field numbers up to 15). Records mostly share a few lengths: cached."""
    return bytes((tag,)) + varint(length)


@functools.lru_cache(maxsize=4096)
def framed_size(length: int) -> int:
    """Bytes a ``length``-byte value takes framed by :func:`field_header`."""
    return 1 + len(varint(length)) + length


@overload
def frame_records(records: Iterable[bytes | None], tag: int, *, mutable: Literal[False] = ...) -> bytes: ...
@overload
def frame_records(records: Iterable[bytes | None], tag: int, *, mutable: Literal[True]) -> bytearray: ...
def frame_records(records: Iterable[bytes | None], tag: int, *, mutable: bool = False) -> bytes | bytearray:
    """``records`` framed as a ``repeated bytes`` field with the one-byte ``tag``; None (a record
    the log no longer holds) is framed as an empty value. ``mutable``: a bytearray, still one
    copy of the records."""
    parts: list[bytes] = []
    add = parts.append
    for record in records:
        if record:
            add(field_header(tag, len(record)))
            add(record)
        else:
            add(field_header(tag, 0))
    return (bytearray() if mutable else b"").join(parts)
