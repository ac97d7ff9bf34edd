"""Pull replies assembled from records framed in protobuf's wire form (libstore.record_framing).

The commitlog answers Read with its records framed as ``ReadResponse.records`` (field 1); a
gateway re-tags them as ``PullResponse.records`` (field 6) in place (an embedded one has them
framed so at once) and answers Pull/PullMany with them next to the fields protobuf encodes.
Handlers that return such bytes are served through :func:`accepts_encoded_replies`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from libstore.record_framing import WIRE_LENGTH_DELIMITED, field_header

READ_RECORDS_TAG = 1 << 3 | WIRE_LENGTH_DELIMITED  # ReadResponse.records = 1
PULL_RECORDS_TAG = 6 << 3 | WIRE_LENGTH_DELIMITED  # PullResponse.records = 6
PULL_MANY_RESULTS_TAG = 1 << 3 | WIRE_LENGTH_DELIMITED  # PullManyResponse.results = 1


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
