"""Unary calls between the services carried on one open stream per channel (``CallMux``).

grpc.aio spends about 570 us of CPU (client and server together) on a unary call with a small
request, and about 250 us on one message each way of a stream already open: every call sets up
an HTTP/2 stream, its metadata and its deadline, and runs a few more Cython callbacks and tasks
on both ends. In the split topology the services call each other for every acknowledgement,
pop and small append (a RocketMQ client's ack costs a gateway -> dispatch call and a dispatch
-> commitlog journal append), so those calls go on a stream instead:

* :class:`CallMuxServicer` (server end, mqstore.v1.CallMux/Calls) runs each MuxRequest as the
  unary method it names, through the same wrapped handler a unary call of that method runs
  (services._common.server: error mapping included), as its own task: calls on one stream
  run concurrently and are answered as they finish. A failure is answered with the status the
  unary call would have ended with (code, message and trailing metadata: the ErrorInfo and
  retry hint of services._common.errors). The request's ``timeout_ms`` bounds the call
  (DEADLINE_EXCEEDED), a ``cancel`` message cancels it, and the calls of a stream that ends
  are finished (the caller closed its side) or cancelled (the stream failed). At most
  MAX_CALLS_PER_STREAM run at once; later ones wait in order while the stream is still read.
  A stopping server (GrpcServer.stop -> :meth:`CallMuxServicer.drain`) answers new calls
  UNAVAILABLE without running them, as a stopping server refuses new unary calls, and ends
  each stream once its running calls are answered.
* :class:`CallMux` (client end) sends a method's calls on one stream per channel, opened at
  the first call and again after a failure, and hands back the reply or raises the
  grpc.aio.AioRpcError the unary call would have raised, so callers (services._common.remote:
  retries and StoreError mapping) see no difference. A stream that breaks fails its open
  calls UNAVAILABLE (as a connection lost during a unary call does). A server without the
  service (an older release, rolling upgrades) answers UNIMPLEMENTED once; the channel's calls
  then go unary.

Trace context: while an exporter is attached (services._common.telemetry), each call gets a
client span whose context travels in the request (W3C ``traceparent``), and the server opens
the call's server span under it, as the gRPC interceptors do for unary calls; without one
nothing is injected, extracted or opened.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar, cast

import grpc
from google.protobuf import message_factory
from opentelemetry import propagate, trace

from services._common.telemetry import tracer
from services.proto import mux_grpc, mux_pb

log = logging.getLogger(__name__)

T = TypeVar("T")

SERVICE_NAME = "mqstore.v1.CallMux"
CALLS_METHOD = f"/{SERVICE_NAME}/Calls"
READY_KEY = "mqstore-call-mux"  # the header a server sends as it opens a Calls stream
MAX_CALLS_PER_STREAM = 1024  # calls a server runs at once for one stream; later ones wait
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_NO_METADATA = grpc.aio.Metadata()

HandlerLookup = Callable[[str], "grpc.RpcMethodHandler | None"]


# -- server ------------------------------------------------------------------------------------------


class _Aborted(grpc.aio.AbortError):
    """A handler ended its call with a status (``context.abort``/``abort_with_status``)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Any) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailing = tuple(trailing or ())


class MuxCallContext:
    """The ServicerContext a carried call's handler gets: the stream's peer and auth context,
    the call's own deadline, and aborts that end only this call. What a unary handler of the
    internal services uses; the stream's metadata stands for the call's."""

    def __init__(self, stream: grpc.aio.ServicerContext, deadline: float | None) -> None:
        self._stream = stream
        self._deadline = deadline
        self.trailing: tuple[Any, ...] = ()
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def peer(self) -> str:
        return self._stream.peer()

    def auth_context(self) -> Any:
        return self._stream.auth_context()

    def invocation_metadata(self) -> Any:
        return self._stream.invocation_metadata()

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    def set_trailing_metadata(self, trailing_metadata: Any) -> None:
        self.trailing = tuple(trailing_metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def cancelled(self) -> bool:
        return self._stream.cancelled()

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Aborted(code, details, trailing_metadata or self.trailing)

    async def abort_with_status(self, status: grpc.Status) -> None:
        raise _Aborted(status.code, status.details, status.trailing_metadata)


def _status_reply(call_id: int, code: grpc.StatusCode, details: str, trailing: Any = ()) -> mux_pb.MuxReply:
    """A call's reply that ends it with status ``code`` (not OK) and its trailing metadata."""
    trailers = [
        mux_pb.MuxTrailer(key=key, value=value if isinstance(value, bytes) else str(value).encode())
        for key, value in trailing
    ]
    return mux_pb.MuxReply(id=call_id, code=code.value[0], details=details, trailers=trailers)


class CallMuxServicer(mux_grpc.CallMuxServicer):
    """The server end (module doc): ``lookup`` gives the handler a unary call of a full method
    name runs on this server (None: not served here, answered UNIMPLEMENTED)."""

    def __init__(self, lookup: HandlerLookup, *, max_calls: int = MAX_CALLS_PER_STREAM) -> None:
        self._lookup = lookup
        self._max_calls = max_calls
        self._tracer = tracer("mqstore.mux")
        self._streams: set[_ServedStream] = set()
        self._draining = False

    async def Calls(
        self, request_iterator: AsyncIterator[mux_pb.MuxRequest], context: grpc.aio.ServicerContext
    ) -> None:
        await context.send_initial_metadata(((READY_KEY, "1"),))
        stream = _ServedStream(self, context, self._max_calls)
        if self._draining:
            stream.drain()
        self._streams.add(stream)
        try:
            await stream.serve(request_iterator)
        finally:
            self._streams.discard(stream)

    def drain(self) -> None:
        """The server is stopping: every stream refuses further calls (UNAVAILABLE, not run,
        so callers send them again elsewhere or later) and ends once its running calls are
        answered. Call before ``grpc.aio.Server.stop``, whose grace then waits for those."""
        self._draining = True
        for stream in list(self._streams):
            stream.drain()

    async def run_call(self, request: mux_pb.MuxRequest, stream: grpc.aio.ServicerContext) -> mux_pb.MuxReply:
        """Run the call ``request`` carries, on the stream whose context is ``stream``: its reply
        (the response, or the status the unary call would have ended with)."""
        handler = self._lookup(request.method)
        if handler is None or handler.unary_unary is None:
            why = f"{request.method} is not a unary method of this server"
            return _status_reply(request.id, grpc.StatusCode.UNIMPLEMENTED, why)
        timeout_s = request.timeout_ms / 1000.0 if request.timeout_ms else None
        loop = asyncio.get_running_loop()
        ctx = MuxCallContext(stream, loop.time() + timeout_s if timeout_s is not None else None)
        try:
            message = handler.request_deserializer(request.payload)
        except Exception:  # a payload that is not the method's request
            why = f"the payload is not a request of {request.method}"
            return _status_reply(request.id, grpc.StatusCode.INVALID_ARGUMENT, why)
        try:
            with self._span(request):
                async with asyncio.timeout(timeout_s):
                    response = await handler.unary_unary(message, ctx)
            if ctx.code not in (None, grpc.StatusCode.OK):  # set_code, then a normal return
                raise _Aborted(ctx.code, ctx.details, ctx.trailing)
            return mux_pb.MuxReply(id=request.id, payload=handler.response_serializer(response))
        except _Aborted as aborted:
            return _status_reply(request.id, aborted.code, aborted.details, aborted.trailing)
        except TimeoutError:
            return _status_reply(request.id, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except Exception:  # the handlers map their errors (map_errors); this is a bug
            log.exception("%s failed on the call stream", request.method)
            return _status_reply(request.id, grpc.StatusCode.INTERNAL, "internal error")

    @contextlib.contextmanager
    def _span(self, request: mux_pb.MuxRequest) -> Iterator[None]:
        """The call's server span, under the caller's context, while an exporter is attached."""
        if not self._tracer.sampler.exporting:
            yield
            return
        parent = propagate.extract(dict(request.trace)) if request.trace else None
        with self._tracer.inner.start_as_current_span(
            request.method, context=parent, kind=trace.SpanKind.SERVER
        ):
            yield


class _ServedStream:
    """One caller's Calls stream on the server: its calls and its writes.

    The stream is always read: at most ``max_calls`` calls run at once, later ones wait in
    arrival order (held long polls must not stop an ack or a cancel behind them), and a
    cancel reaches a waiting call as well as a running one. A call's reply is written from the
    call's own task, once its caller can no longer cancel it (a task cancelled while it awaits
    a grpc.aio write leaves that write under way, and the stream's next write then fails:
    GRPC_CALL_ERROR_TOO_MANY_OPERATIONS). Draining (the server stopping): calls that arrive
    are answered UNAVAILABLE without being run, and once the running ones are answered the
    stream ends, so the caller opens its next stream on a server that takes calls."""

    def __init__(self, servicer: CallMuxServicer, context: grpc.aio.ServicerContext, max_calls: int) -> None:
        self._servicer = servicer
        self._context = context
        self._max_calls = max_calls
        self._cancellable: dict[int, asyncio.Task[None]] = {}  # running calls, by id
        self._tasks: set[asyncio.Task[None]] = set()  # every unfinished call, answering ones too
        self._queued: collections.OrderedDict[int, mux_pb.MuxRequest] = collections.OrderedDict()
        self._write_lock = asyncio.Lock()  # one write at a time on a stream
        self._draining = False
        self._read_all = False  # the caller closed its side
        self._done = asyncio.Event()

    async def serve(self, request_iterator: AsyncIterator[mux_pb.MuxRequest]) -> None:
        """Run the stream's calls until the caller closes its side (or the server drains),
        then finish the open ones."""
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read(request_iterator), name="call-mux-requests")
        try:
            await self._done.wait()
        finally:  # answered in full, or the stream failed: nothing more can be written
            reader.cancel()
            self._queued.clear()
            for task in list(self._tasks):
                task.cancel()

    def drain(self) -> None:
        """Refuse further calls (UNAVAILABLE, not run); end once the running ones are answered."""
        self._draining = True
        while self._queued:
            self._start(self._queued.popitem(last=False)[1])
        self._check_done()

    async def _read(self, request_iterator: AsyncIterator[mux_pb.MuxRequest]) -> None:
        try:
            async for request in request_iterator:
                if request.cancel:
                    self._cancel(request.id)
                elif len(self._tasks) >= self._max_calls and not self._draining:
                    self._queued[request.id] = request
                else:
                    self._start(request)
        except Exception:  # the stream failed under the read: serve() ends with the call
            log.debug("call stream read ended", exc_info=True)
        finally:
            self._read_all = True
            self._check_done()

    def _cancel(self, call_id: int) -> None:
        if self._queued.pop(call_id, None) is None:  # a queued call is dropped unanswered
            task = self._cancellable.get(call_id)
            if task is not None:
                task.cancel()

    def _start(self, request: mux_pb.MuxRequest) -> None:
        task = asyncio.get_running_loop().create_task(self._call(request, refuse=self._draining))
        self._cancellable[request.id] = task
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._finished, request.id))

    def _finished(self, call_id: int, task: asyncio.Task[None]) -> None:
        if self._cancellable.get(call_id) is task:
            del self._cancellable[call_id]
        self._tasks.discard(task)
        while self._queued and len(self._tasks) < self._max_calls:
            self._start(self._queued.popitem(last=False)[1])
        self._check_done()

    def _check_done(self) -> None:
        if not self._tasks and not self._queued and (self._read_all or self._draining):
            self._done.set()

    async def _call(self, request: mux_pb.MuxRequest, *, refuse: bool) -> None:
        """Run one call and answer it; a call its caller cancelled is not answered."""
        if refuse:
            reply = _status_reply(request.id, grpc.StatusCode.UNAVAILABLE, "the server is stopping")
        else:
            reply = await self._servicer.run_call(request, self._context)
        if self._cancellable.get(request.id) is asyncio.current_task():
            del self._cancellable[request.id]  # no cancel reaches a call that is answering
        # Any failure to write: the stream is gone, and its caller has failed this call.
        with contextlib.suppress(Exception):
            async with self._write_lock:
                await self._context.write(reply)


def add_to_server(servicer: CallMuxServicer, server: grpc.aio.Server) -> list[str]:
    """Serve ``servicer`` on ``server`` itself: not through a WrappingRegistrar (the calls it
    carries run their own methods' wrapped handlers) and not as a registered method (grpc.aio
    waits on a pending request per registered method for every call it takes)."""
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.Calls,
        request_deserializer=mux_pb.MuxRequest.FromString,
        response_serializer=mux_pb.MuxReply.SerializeToString,
    )
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE_NAME, {"Calls": handler})])
    return [SERVICE_NAME]


# -- client ------------------------------------------------------------------------------------------


class _Unsupported(Exception):
    """The server does not serve CallMux: the call was not run; send it unary."""


def _rpc_error(code: grpc.StatusCode, details: str, trailing: Any = ()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, _NO_METADATA, grpc.aio.Metadata(*trailing), details)


def _reply_error(reply: mux_pb.MuxReply) -> grpc.aio.AioRpcError:
    trailing = [(t.key, t.value if t.key.endswith("-bin") else t.value.decode()) for t in reply.trailers]
    return _rpc_error(_CODES.get(reply.code, grpc.StatusCode.UNKNOWN), reply.details, trailing)


class _Stream:
    """One open Calls stream: the calls waiting for its replies, and its writer. Requests are
    written by a task of their own, in the order put: a task cancelled while it awaits a
    grpc.aio write leaves that write under way and the stream's next write then fails
    (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS), and callers may be cancelled at any await. The
    writer first waits for the server's READY_KEY header: nothing is sent to a server that
    does not serve CallMux, so its calls can go unary."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self.call = call
        self.waiting: dict[int, asyncio.Future[mux_pb.MuxReply]] = {}
        self.broken: BaseException | None = None
        self.closing = False
        self._outbox: asyncio.Queue[mux_pb.MuxRequest] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.writer = loop.create_task(self._write_all(), name="call-mux-writer")
        self.reader: asyncio.Task[None] | None = None

    def put(self, request: mux_pb.MuxRequest) -> None:
        self._outbox.put_nowait(request)

    async def _write_all(self) -> None:
        try:
            if not await self._served():
                self.fail(_Unsupported())
                self.call.cancel()
                return
            while True:
                request = await self._outbox.get()
                if request.cancel or request.id in self.waiting:  # not a call given up meanwhile
                    await self.call.write(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the call is over, or cannot be written: as a lost connection
            why = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            self.fail(_rpc_error(grpc.StatusCode.UNAVAILABLE, f"the call stream failed: {why}"))
            self.call.cancel()

    async def _served(self) -> bool:
        """Whether the server opened the stream as CallMux (False: it ended the call
        UNIMPLEMENTED, or answered without READY_KEY). Raises the call's error otherwise."""
        metadata = await self.call.initial_metadata()
        if any(key == READY_KEY for key, _ in metadata or ()):
            return True
        if self.call.done():
            code = await self.call.code()
            if code is not grpc.StatusCode.UNIMPLEMENTED:
                raise _rpc_error(code, await self.call.details())
        return False

    def fail(self, exc: BaseException) -> None:
        """The stream is done: every call still waiting gets ``exc``."""
        if self.broken is None:
            self.broken = exc
        self.writer.cancel()
        waiting, self.waiting = self.waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(exc)

    async def close(self) -> None:
        """End the stream (calls still waiting fail CANCELLED)."""
        self.closing = True
        self.call.cancel()
        self.writer.cancel()
        if self.reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader


class CallMux:
    """The client end of ``channel`` (module doc). :meth:`method` gives a callable with a unary
    multicallable's shape (``await m(request, timeout=s)``) that carries the calls."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._open_call = channel.stream_stream(
            CALLS_METHOD,
            request_serializer=mux_pb.MuxRequest.SerializeToString,
            response_deserializer=mux_pb.MuxReply.FromString,
        )
        self._ids = itertools.count(1)
        self._stream: _Stream | None = None
        self.supported = True  # False once the server turned the stream down (UNIMPLEMENTED)
        self.tracer = tracer("mqstore.mux")

    def method(
        self, unary: grpc.aio.UnaryUnaryMultiCallable, name: str, response_type: Any
    ) -> MuxMethod[Any]:
        """Calls of the full method ``name`` (whose unary multicallable is ``unary``, used when
        the server has no CallMux) answered with ``response_type`` messages."""
        return MuxMethod(self, unary, name, response_type.FromString)

    def _current(self) -> _Stream:
        stream = self._stream
        if stream is None or stream.broken is not None:
            stream = self._stream = _Stream(self._open_call())
            stream.reader = asyncio.get_running_loop().create_task(self._read(stream), name="call-mux-reader")
        return stream

    async def _read(self, stream: _Stream) -> None:
        """Hand each reply to its call; when the stream ends, fail what still waits."""
        failure: BaseException
        try:
            while True:
                reply = await stream.call.read()
                if reply is grpc.aio.EOF:
                    failure = _rpc_error(grpc.StatusCode.UNAVAILABLE, "the call stream ended")
                    break
                future = stream.waiting.pop(reply.id, None)
                if future is not None and not future.done():
                    future.set_result(reply)
        except grpc.aio.AioRpcError as err:
            if err.code() is grpc.StatusCode.UNIMPLEMENTED:  # nothing was sent (_Stream)
                failure = _Unsupported()
            else:
                failure = _rpc_error(
                    grpc.StatusCode.UNAVAILABLE if err.code() is grpc.StatusCode.CANCELLED else err.code(),
                    f"the call stream failed: {err.details()}",
                )
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if stream.closing or (task is not None and task.cancelling()):  # close()
                stream.fail(_rpc_error(grpc.StatusCode.CANCELLED, "the call stream was closed"))
                raise
            # The call was cancelled under the read (a failed write ends it so): a lost connection.
            failure = _rpc_error(grpc.StatusCode.UNAVAILABLE, "the call stream was cancelled")
        except Exception as exc:  # pragma: no cover - grpc raises AioRpcError
            failure = _rpc_error(grpc.StatusCode.UNAVAILABLE, f"the call stream failed: {exc}")
        stream.fail(failure)

    async def invoke(self, name: str, payload: bytes, timeout: float | None) -> mux_pb.MuxReply:
        """Send one call and wait for its reply (any status); raises _Unsupported, or the
        AioRpcError of a stream that failed or a deadline that passed."""
        stream = self._current()
        call_id = next(self._ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[mux_pb.MuxReply] = loop.create_future()
        stream.waiting[call_id] = future
        request = mux_pb.MuxRequest(id=call_id, method=name, payload=payload)
        if timeout is not None:
            request.timeout_ms = max(1, int(timeout * 1000))
        if self.tracer.sampler.exporting:
            propagate.inject(request.trace)
        timer = loop.call_later(timeout, self._expire, stream, call_id) if timeout is not None else None
        stream.put(request)
        try:
            return await future
        except asyncio.CancelledError:
            if stream.waiting.pop(call_id, None) is not None and stream.broken is None:
                stream.put(mux_pb.MuxRequest(id=call_id, cancel=True))
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, stream: _Stream, call_id: int) -> None:
        future = stream.waiting.pop(call_id, None)
        if future is not None and not future.done():
            future.set_exception(_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
            if stream.broken is None:  # the server stops it too
                stream.put(mux_pb.MuxRequest(id=call_id, cancel=True))

    async def close(self) -> None:
        """End the stream (calls still waiting fail CANCELLED)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()


class MuxMethod(Generic[T]):
    """One method carried by a :class:`CallMux` (its :meth:`CallMux.method`)."""

    def __init__(
        self,
        mux: CallMux,
        unary: grpc.aio.UnaryUnaryMultiCallable,
        name: str,
        parse: Callable[[bytes], T],
    ) -> None:
        self._mux = mux
        self._unary = unary
        self.name = name
        self._parse = parse

    async def __call__(self, request: Any, timeout: float | None = None) -> T:
        """The response to ``request`` within ``timeout`` seconds (None: no deadline); raises
        grpc.aio.AioRpcError as the unary call would."""
        mux = self._mux
        if not mux.supported:
            return await self._unary(request, timeout=timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout is not None else None
        try:
            # Named as the gRPC instrumentation names a unary call's span.
            with mux.tracer.start_as_current_span(self.name, kind=trace.SpanKind.CLIENT):
                reply = await mux.invoke(self.name, request.SerializeToString(), timeout)
                if reply.code:  # raised inside the span, which records it
                    raise _reply_error(reply)
                return self._parse(reply.payload)
        except _Unsupported:  # nothing was sent: the unary call, within what is left
            mux.supported = False
            log.info("%s has no call stream (an older server): calls go unary", self.name)
            left = max(0.001, deadline - loop.time()) if deadline is not None else None
            return await self._unary(request, timeout=left)


_BY_CHANNEL: weakref.WeakKeyDictionary[grpc.aio.Channel, CallMux] = weakref.WeakKeyDictionary()


def channel_mux(channel: grpc.aio.Channel) -> CallMux:
    """The CallMux of ``channel``: one stream per channel, whoever calls over it."""
    mux = _BY_CHANNEL.get(channel)
    if mux is None:
        mux = _BY_CHANNEL[channel] = CallMux(channel)
    return mux


async def close_channel(channel: grpc.aio.Channel) -> None:
    """Close ``channel``, its CallMux stream first (its tasks end before the loop does)."""
    mux = _BY_CHANNEL.pop(channel, None)
    if mux is not None:
        await mux.close()
    await channel.close()


S = TypeVar("S")


class _CarriedStub:
    """``stub`` with the methods in ``carried`` replaced by :class:`MuxMethod` s of ``mux``."""

    def __init__(self, stub: Any, mux: CallMux, service: Any, carried: Iterable[str]) -> None:
        self._stub = stub
        for name in carried:
            method = service.methods_by_name[name]
            response_type = message_factory.GetMessageClass(method.output_type)
            full_name = f"/{service.full_name}/{name}"
            setattr(self, name, mux.method(getattr(stub, name), full_name, response_type))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)


def carried_stub(stub: S, mux: CallMux, service: Any, carried: Iterable[str]) -> S:
    """``stub`` (a generated stub of the service whose ServiceDescriptor is ``service``) with its
    methods named in ``carried`` sent on ``mux``'s stream; its other methods stay unary.
    Raises KeyError for a name the service does not have."""
    return cast(S, _CarriedStub(stub, mux, service, carried))
