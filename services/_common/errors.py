"""StoreError ⇄ gRPC status, mapped once per direction (DESIGN "Error model").

Server side, :func:`map_errors` (wrapped around every method once, when a server registers it)
turns a StoreError escaping a servicer into a ``google.rpc.Status`` with the matching code and
an ``ErrorInfo`` whose ``reason`` is the error's RocketMQ-style name (``MESSAGE_ILLEGAL``,
``TOPIC_NOT_EXIST``...); any other exception becomes INTERNAL with the trace id, and is logged.
Servicers therefore hold no try/except.

Client side, :func:`store_error_from_rpc` maps a failed call back to the same StoreError class
(by reason, else by code), so callers of a remote port see what callers of a local one see.

A SystemBusyError (push back: nothing was written, send again later) also carries its hint the
two standard ways: a ``google.rpc.RetryInfo`` detail and gRPC's ``grpc-retry-pushback-ms``
trailer (what gRPC's own retry policy reads); :func:`retry_pushback_ms` reads it back.

    StoreError                      code
    MessageIllegalError (+subs),
    InvalidArgumentError, Config    INVALID_ARGUMENT
    TopicNotFoundError, MessageNotFound NOT_FOUND
    OffsetOutOfRangeError           OUT_OF_RANGE
    NotMasterError, StoreLocked,
    LogDivergedError, RoleSwitch    FAILED_PRECONDITION
    OSPageCacheBusy, DiskFull,
    TooManyRequests, SystemBusy     RESOURCE_EXHAUSTED
    ServiceNotAvailable, StoreIO    UNAVAILABLE
    CorruptRecordError              DATA_LOSS
    AuthenticationError             UNAUTHENTICATED
    PermissionDeniedError           PERMISSION_DENIED
"""

from __future__ import annotations

import collections
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry import trace

from libstore import errors as E

log = logging.getLogger(__name__)

DOMAIN = "mqstore"
_STATUS_DETAILS_KEY = "grpc-status-details-bin"
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"

# By class: an error takes the entry of its nearest class in the StoreError tree
# (libstore.errors.nearest_entry), so a subclass's entry wins over its base's whatever the order.
_CODES: dict[type[BaseException], grpc.StatusCode] = {
    E.ServiceNotAvailableError: grpc.StatusCode.UNAVAILABLE,
    E.NotMasterError: grpc.StatusCode.FAILED_PRECONDITION,
    E.OSPageCacheBusyError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    E.TooManyRequestsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    E.StoreIOError: grpc.StatusCode.UNAVAILABLE,
    E.DiskFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    E.AuthenticationError: grpc.StatusCode.UNAUTHENTICATED,
    E.PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    E.MessageIllegalError: grpc.StatusCode.INVALID_ARGUMENT,
    E.InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    E.ConfigError: grpc.StatusCode.INVALID_ARGUMENT,
    E.TopicNotFoundError: grpc.StatusCode.NOT_FOUND,
    E.MessageNotFoundError: grpc.StatusCode.NOT_FOUND,
    E.OffsetOutOfRangeError: grpc.StatusCode.OUT_OF_RANGE,
    E.StoreLockedError: grpc.StatusCode.FAILED_PRECONDITION,
    E.LogDivergedError: grpc.StatusCode.FAILED_PRECONDITION,
    E.RoleSwitchError: grpc.StatusCode.FAILED_PRECONDITION,
    E.CorruptRecordError: grpc.StatusCode.DATA_LOSS,
}
_BY_REASON: dict[str, type[E.StoreError]] = {
    cls.reason: cls for cls in vars(E).values() if isinstance(cls, type) and issubclass(cls, E.StoreError)
}
_BY_CODE: dict[grpc.StatusCode, type[E.StoreError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: E.InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: E.TopicNotFoundError,
    grpc.StatusCode.OUT_OF_RANGE: E.OffsetOutOfRangeError,
    grpc.StatusCode.FAILED_PRECONDITION: E.ServiceNotAvailableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: E.ServiceNotAvailableError,
    grpc.StatusCode.UNAVAILABLE: E.ServiceNotAvailableError,
    grpc.StatusCode.DATA_LOSS: E.CorruptRecordError,
    grpc.StatusCode.UNAUTHENTICATED: E.AuthenticationError,
    grpc.StatusCode.PERMISSION_DENIED: E.PermissionDeniedError,
}


def status_code_of(exc: E.StoreError) -> grpc.StatusCode:
    """The gRPC status code for ``exc`` (by its nearest mapped class; INTERNAL when none)."""
    return E.nearest_entry(_CODES, exc, grpc.StatusCode.INTERNAL)


def to_rpc_status(exc: E.StoreError) -> grpc.Status:
    """A rich status for ``exc``: code, message, ErrorInfo(reason, domain "mqstore")."""
    code = status_code_of(exc)
    info = error_details_pb2.ErrorInfo(reason=type(exc).reason, domain=DOMAIN, metadata=exc.details())
    detail = any_pb2.Any()
    detail.Pack(info)
    proto = status_pb2.Status(code=code.value[0], message=str(exc) or type(exc).__name__, details=[detail])
    if not isinstance(exc, E.SystemBusyError):
        return rpc_status.to_status(proto)
    retry = any_pb2.Any()
    delay = duration_pb2.Duration()
    delay.FromMilliseconds(exc.retry_after_ms)
    retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    proto.details.append(retry)
    status = rpc_status.to_status(proto)
    return _PushbackStatus(
        status.code,
        status.details,
        (*status.trailing_metadata, (RETRY_PUSHBACK_KEY, str(exc.retry_after_ms))),
    )


class _PushbackStatus(
    collections.namedtuple("_PushbackStatus", ("code", "details", "trailing_metadata")), grpc.Status
):
    """A status with an extra trailer (grpc_status builds one with the details trailer only)."""


def _internal_status(exc: BaseException) -> grpc.Status:
    span = trace.get_current_span().get_span_context()
    trace_id = f"{span.trace_id:032x}" if span.is_valid else "none"
    proto = status_pb2.Status(
        code=code_pb2.INTERNAL, message=f"internal error ({type(exc).__name__}); trace id {trace_id}"
    )
    return rpc_status.to_status(proto)


async def _abort_for(context: grpc.aio.ServicerContext, exc: Exception, method: str) -> None:
    """End the call with the status ``exc`` stands for (logged when it is not a StoreError)."""
    if isinstance(exc, E.StoreError):
        await context.abort_with_status(to_rpc_status(exc))
    log.exception("%s failed", method)
    await context.abort_with_status(_internal_status(exc))


MethodWrapper = Callable[[str, grpc.RpcMethodHandler], grpc.RpcMethodHandler]
"""Wraps one method's handler (given its full name, ``/package.Service/Method``) once, when the
server registers it (services._common.server): what a server interceptor would do for every
call, without grpc.aio running an interceptor chain per call."""


def map_errors(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` with the exceptions escaping it mapped to statuses (module doc): a StoreError
    to its code and ErrorInfo, anything else to INTERNAL (logged); aborts the servicer chose
    itself pass unchanged. Unary-unary, unary-stream and stream-stream handlers (streams are
    async generators) are wrapped; any other kind is returned as it is. A MethodWrapper."""
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await inner(request, context)
            except (grpc.aio.AbortError, grpc.aio.UsageError):
                raise
            except Exception as exc:
                await _abort_for(context, exc, method)

        return grpc.unary_unary_rpc_method_handler(
            unary, handler.request_deserializer, handler.response_serializer
        )
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in inner_stream(request, context):
                    yield item
            except (grpc.aio.AbortError, grpc.aio.UsageError):
                raise
            except Exception as exc:
                await _abort_for(context, exc, method)

        return grpc.unary_stream_rpc_method_handler(
            stream, handler.request_deserializer, handler.response_serializer
        )
    if handler.stream_stream is not None:
        inner_bidi = handler.stream_stream

        async def bidi(request_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in inner_bidi(request_iterator, context):
                    yield item
            except (grpc.aio.AbortError, grpc.aio.UsageError):
                raise
            except Exception as exc:
                await _abort_for(context, exc, method)

        return grpc.stream_stream_rpc_method_handler(
            bidi, handler.request_deserializer, handler.response_serializer
        )
    return handler


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo of a failed call, if the server sent one."""
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == _STATUS_DETAILS_KEY:
            proto = status_pb2.Status.FromString(value)
            for detail in proto.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    return info
    return None


def retry_pushback_ms(err: grpc.RpcError) -> int | None:
    """The server's retry hint of a failed call (``grpc-retry-pushback-ms``, milliseconds), or
    None when it gave none: only a push back (SYSTEM_BUSY) carries one."""
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == RETRY_PUSHBACK_KEY:
            try:
                return max(0, int(value))
            except ValueError:
                return None
    return None


def error_reason(err: grpc.RpcError) -> str | None:
    """The ErrorInfo reason of a failed call, if the server sent one."""
    info = error_info(err)
    return info.reason if info is not None else None


def store_error_of(reason: str, message: str) -> E.StoreError:
    """The StoreError whose ``reason`` is given (StoreError itself for an unknown one)."""
    return _BY_REASON.get(reason, E.StoreError)(message)


def store_error_from_rpc(err: grpc.RpcError) -> E.StoreError | None:
    """The StoreError a failed call stands for (None for codes with no store meaning, such as
    DEADLINE_EXCEEDED or CANCELLED: callers decide about those)."""
    code = err.code() if hasattr(err, "code") else None
    message = err.details() if hasattr(err, "details") else str(err)
    info = error_info(err)
    cls = _BY_REASON.get(info.reason if info is not None else "")
    if cls is None:
        cls = _BY_CODE.get(code)
    if cls is None:
        return None
    exc = cls.from_details(message or cls.__name__, dict(info.metadata) if info is not None else {})
    exc.grpc_code = code  # type: ignore[attr-defined]
    return exc
