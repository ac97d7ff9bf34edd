"""Pull replies assembled from records framed in protobuf's wire form (libstore.record_framing).

Used for pulls: the commitlog answers Read with its records framed as ``ReadResponse.records``
(field 1); a gateway re-tags them as ``PullResponse.records`` (field 6) in place (an embedded
one frames them so at once) and answers Pull/PullMany with them next to the fields protobuf
encodes. Handlers that
return such bytes are served through :func:`accepts_encoded_replies`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from libstore.record_framing import WIRE_LENGTH_DELIMITED, field_header, framed_size

READ_RECORDS_TAG = 1 << 3 | WIRE_LENGTH_DELIMITED  # ReadResponse.records = 1
PULL_RECORDS_TAG = 6 << 3 | WIRE_LENGTH_DELIMITED  # PullResponse.records = 6
PULL_MANY_RESULTS_TAG = 1 << 3 | WIRE_LENGTH_DELIMITED  # PullManyResponse.results = 1


def record_starts(sizes: Sequence[int], framed: bytes | bytearray) -> list[int] | None:
    """Where each of the records of ``sizes`` (bytes each, in order) starts in ``framed`` (their
    wire form from libstore.record_framing.frame_records), the end of the last appended: ``len(sizes) + 1``
    positions. None when ``framed`` is not exactly that long: a record is missing (framed
    empty) or shorter, so the caller must look at the records one by one."""
    starts = list(itertools.accumulate(map(framed_size, sizes), initial=0))
    return starts if starts[-1] == len(framed) else None


def retag(framed: bytearray, sizes: Sequence[int], tag: int) -> None:
    """Give every record framed in ``framed`` the field ``tag``, in place (lengths unchanged).
    ``sizes``: the records' sizes as asked for, which place them when every one is there; else
    (a record framed empty, a size 0 that read a whole record) the framing is walked."""
    starts = record_starts(sizes, framed)
    if starts is not None:
        for start in itertools.islice(starts, len(starts) - 1):
            framed[start] = tag
        return
    pos, end = 0, len(framed)
    while pos < end:
        framed[pos] = tag
        pos += 1
        length = shift = 0
        while True:
            byte = framed[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        pos += length


def length_delimited(tag: int, parts: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """``parts`` (a message's encoding in pieces) as one length-delimited field with ``tag``:
    the pieces to join, header first."""
    return [field_header(tag, sum(map(len, parts))), *parts]


def _encoded_or(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    def serialize_reply(reply: Any) -> bytes:
        return reply if type(reply) is bytes else serialize(reply)

    return serialize_reply


def accepts_encoded_replies(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` (a unary-unary one; others are returned as they are) whose replies may also
    be ``bytes``: a reply already encoded, sent as it is. A MethodWrapper
    (services._common.errors)."""
    if handler.unary_unary is None or handler.response_serializer is None:
        return handler
    return grpc.unary_unary_rpc_method_handler(
        handler.unary_unary, handler.request_deserializer, _encoded_or(handler.response_serializer)
    )
