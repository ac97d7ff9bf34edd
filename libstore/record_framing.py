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

from libstore.record_codec import native

WIRE_LENGTH_DELIMITED = 2
Framed = bytes | bytearray | memoryview  # a run of framed values


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


def frame_records(records: Iterable[bytes | None], tag: int) -> bytes:
    """``records`` framed as a ``repeated bytes`` field with the one-byte ``tag``; None (a record
    the log no longer holds) is framed as an empty value."""
    parts: list[bytes] = []
    add = parts.append
    for record in records:
        if record:
            add(field_header(tag, len(record)))
            add(record)
        else:
            add(field_header(tag, 0))
    return b"".join(parts)


def _value_at(framed: Framed, pos: int) -> tuple[int, int, int]:
    """(tag, length, end) of the value framed at ``pos``; ValueError when it is cut short."""
    end = len(framed)
    if pos >= end:
        raise ValueError("no value here")
    tag = framed[pos]
    pos += 1
    length = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("a length cut short")
        byte = framed[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    if length > end - pos:
        raise ValueError("a value past the end")
    return tag, length, pos + length


def value_starts(
    framed: bytes | bytearray | memoryview, tag: int, count: int
) -> tuple[list[int], int] | None:
    """When ``framed`` holds exactly ``count`` values, each framed with ``tag`` and none empty
    (a record the log no longer holds is framed empty): where each one's tag byte is, plus the
    end (``count + 1`` positions), and the bytes of the values together. Else None: the caller
    then looks at the records one by one. The values are walked, not placed by the sizes that
    were asked for: a transient message's stub reads as its whole, larger record."""
    ext = native()
    if ext is not None:
        found: tuple[list[int], int] | None = ext.framed_starts(framed, tag, count)
        return found
    starts: list[int] = []
    total = pos = 0
    try:
        while pos < len(framed):
            starts.append(pos)
            seen, length, pos = _value_at(framed, pos)
            if seen != tag or length == 0 or len(starts) > count:
                return None
            total += length
    except ValueError:
        return None
    if len(starts) != count:
        return None
    starts.append(len(framed))
    return starts, total


def retag(framed: bytearray, tag: int) -> int:
    """Give every value framed in ``framed`` the one-byte ``tag``, in place (lengths unchanged):
    the records of one reply's field passed on as another's. Returns how many; ValueError,
    ``framed`` unchanged, when it is not a run of length-delimited values."""
    if not 0 <= tag < 0x80:
        raise ValueError(f"a tag is one byte below 0x80, got {tag}")
    ext = native()
    if ext is not None:
        count: int = ext.retag(framed, tag)
        return count
    starts = []
    pos = 0
    while pos < len(framed):
        starts.append(pos)
        pos = _value_at(framed, pos)[2]
    for start in starts:
        framed[start] = tag
    return len(starts)
