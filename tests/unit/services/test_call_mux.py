"""Unary calls carried on a stream (services._common.mux) against a real grpc.aio server on
127.0.0.1: the same answers, errors, retry hints and deadlines as the unary calls, calls that
finish out of order, cancellation reaching the server, a broken stream failing its calls and
the next call opening a new one, and a server without CallMux answered unary."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from libstore.errors import InvalidArgumentError, ServiceNotAvailableError, SystemBusyError
from services._common.errors import retry_pushback_ms, store_error_from_rpc
from services._common.mux import CallMux, CallMuxServicer, carried_stub
from services._common.mux import add_to_server as add_call_mux
from services._common.remote import call
from services._common.server import start_grpc_server
from services.proto import index_grpc, index_pb

SERVICE = index_pb.DESCRIPTOR.services_by_name["IndexService"]


class _Index(index_grpc.IndexServiceServicer):
    """Answers by the request's topic: "echo" gives max_count back as an offset, "slow" first
    sleeps begin_ms ms, "busy" pushes back, "bad" refuses, "gone" aborts NOT_FOUND itself;
    "hold" waits until cancelled. ``ran`` lists the max_count of every call run."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.peers: list[str] = []
        self.ran: list[int] = []

    async def QueryByKey(
        self, request: index_pb.QueryByKeyRequest, context: grpc.aio.ServicerContext
    ) -> index_pb.QueryByKeyResponse:
        self.peers.append(context.peer())
        self.ran.append(request.max_count)
        if request.topic == "gone":
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no topic for {request.key!r}")
        if request.topic == "slow":
            await asyncio.sleep(request.begin_ms / 1000)
        elif request.topic == "busy":
            raise SystemBusyError("too much", retry_after_ms=321)
        elif request.topic == "bad":
            raise InvalidArgumentError(f"no key {request.key!r}")
        elif request.topic == "hold":
            self.started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return index_pb.QueryByKeyResponse(phy_offsets=[request.max_count])


@asynccontextmanager
async def _serving(servicer: _Index, *, call_mux: bool = True) -> AsyncIterator[tuple[int, Callable]]:
    def add(server: grpc.aio.Server) -> list[str]:
        index_grpc.add_IndexServiceServicer_to_server(servicer, server)
        return [SERVICE.full_name]

    running = await start_grpc_server("127.0.0.1:0", add, call_mux=call_mux)
    try:
        yield running.port, running.stop
    finally:
        await running.server.stop(None)


@asynccontextmanager
async def _client(port: int) -> AsyncIterator[tuple[CallMux, index_grpc.IndexServiceStub]]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    mux = CallMux(channel)
    try:
        yield mux, carried_stub(index_grpc.IndexServiceStub(channel), mux, SERVICE, ["QueryByKey"])
    finally:
        await mux.close()
        await channel.close()


def _query(topic: str, count: int = 0, key: str = "k", begin_ms: int = 0) -> index_pb.QueryByKeyRequest:
    return index_pb.QueryByKeyRequest(topic=topic, key=key, max_count=count, begin_ms=begin_ms)


def test_carried_calls_answer_as_unary_calls_do_and_share_one_stream() -> None:
    async def main() -> None:
        servicer = _Index()
        async with _serving(servicer) as (port, _), _client(port) as (mux, stub):
            replies = await asyncio.gather(
                *(stub.QueryByKey(_query("echo", i), timeout=5) for i in range(50))
            )
            assert [list(r.phy_offsets) for r in replies] == [[i] for i in range(50)]
            assert mux.supported
            stream = mux._stream
            assert stream is not None and stream.broken is None  # they went on one open stream
            assert len(servicer.peers) == 50 and len(set(servicer.peers)) == 1
            plain = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            unary = await index_grpc.IndexServiceStub(plain).QueryByKey(_query("echo", 7))
            assert list(unary.phy_offsets) == [7]
            await plain.close()

    asyncio.run(main())


def test_a_store_error_keeps_its_class_message_and_retry_hint() -> None:
    async def main() -> None:
        async with _serving(_Index()) as (port, _), _client(port) as (_, stub):
            with pytest.raises(grpc.aio.AioRpcError) as busy:
                await stub.QueryByKey(_query("busy"), timeout=5)
            assert busy.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert retry_pushback_ms(busy.value) == 321
            mapped = store_error_from_rpc(busy.value)
            assert isinstance(mapped, SystemBusyError) and mapped.retry_after_ms == 321
            # Through the services' call helper, as the remote ports make it: the same class.
            with pytest.raises(InvalidArgumentError, match="no key 'x'"):
                await call(stub.QueryByKey, _query("bad", key="x"), idempotent=True, timeout_s=5)

    asyncio.run(main())


def test_calls_finish_in_their_own_order() -> None:
    async def main() -> None:
        async with _serving(_Index()) as (port, _), _client(port) as (_, stub):
            done: list[str] = []

            async def one(name: str, delay_ms: int) -> None:
                await stub.QueryByKey(_query("slow", begin_ms=delay_ms), timeout=5)
                done.append(name)

            await asyncio.gather(one("first sent", 400), one("second sent", 10))
            assert done == ["second sent", "first sent"]

    asyncio.run(main())


def test_a_deadline_fails_the_call_and_cancels_it_on_the_server() -> None:
    async def main() -> None:
        servicer = _Index()
        async with _serving(servicer) as (port, _), _client(port) as (_, stub):
            with pytest.raises(grpc.aio.AioRpcError) as late:
                await stub.QueryByKey(_query("hold"), timeout=0.3)
            assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.wait_for(servicer.cancelled.wait(), 5)
            # The stream is still good for the next call.
            assert list((await stub.QueryByKey(_query("echo", 3), timeout=5)).phy_offsets) == [3]

    asyncio.run(main())


def test_a_caller_that_gives_up_cancels_the_call_on_the_server() -> None:
    async def main() -> None:
        servicer = _Index()
        async with _serving(servicer) as (port, _), _client(port) as (_, stub):
            waiting = asyncio.ensure_future(stub.QueryByKey(_query("hold"), timeout=20))
            await asyncio.wait_for(servicer.started.wait(), 5)
            waiting.cancel()
            await asyncio.wait_for(servicer.cancelled.wait(), 5)
            with pytest.raises(asyncio.CancelledError):
                await waiting

    asyncio.run(main())


def test_a_server_that_stops_fails_open_calls_and_a_new_server_gets_a_new_stream() -> None:
    async def main() -> None:
        servicer = _Index()
        async with _serving(servicer) as (port, stop):
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            mux = CallMux(channel)
            stub = carried_stub(index_grpc.IndexServiceStub(channel), mux, SERVICE, ["QueryByKey"])
            assert list((await stub.QueryByKey(_query("echo", 1), timeout=5)).phy_offsets) == [1]
            waiting = asyncio.ensure_future(stub.QueryByKey(_query("hold"), timeout=20))
            await asyncio.wait_for(servicer.started.wait(), 5)
            await stop(0)
            with pytest.raises(grpc.aio.AioRpcError) as lost:
                await waiting
            assert lost.value.code() is grpc.StatusCode.UNAVAILABLE
            # The services' call helper maps it as a lost connection.
            assert isinstance(store_error_from_rpc(lost.value), ServiceNotAvailableError)
        # A server again on the same port: the next call opens a new stream.
        async with _serving(_Index()) as (port2, _):
            assert port2
            again = grpc.aio.insecure_channel(f"127.0.0.1:{port2}")
            mux2 = CallMux(again)
            stub2 = carried_stub(index_grpc.IndexServiceStub(again), mux2, SERVICE, ["QueryByKey"])
            assert list((await stub2.QueryByKey(_query("echo", 2), timeout=5)).phy_offsets) == [2]
            await mux2.close()
            await again.close()
        await mux.close()
        await channel.close()

    asyncio.run(main())


def test_calls_after_a_broken_stream_open_a_new_one() -> None:
    async def main() -> None:
        async with _serving(_Index()) as (port, _), _client(port) as (mux, stub):
            assert list((await stub.QueryByKey(_query("echo", 1), timeout=5)).phy_offsets) == [1]
            first = mux._stream
            assert first is not None
            first.call.cancel()  # the stream breaks under the client
            await asyncio.sleep(0.05)
            assert first.broken is not None
            assert list((await stub.QueryByKey(_query("echo", 2), timeout=5)).phy_offsets) == [2]
            assert mux._stream is not first

    asyncio.run(main())


def test_a_server_without_call_mux_is_called_unary() -> None:
    async def main() -> None:
        servicer = _Index()
        async with _serving(servicer, call_mux=False) as (port, _), _client(port) as (mux, stub):
            replies = await asyncio.gather(*(stub.QueryByKey(_query("echo", i), timeout=5) for i in range(3)))
            assert [list(r.phy_offsets) for r in replies] == [[0], [1], [2]]
            assert not mux.supported
            assert list((await stub.QueryByKey(_query("echo", 9), timeout=5)).phy_offsets) == [9]
            with pytest.raises(grpc.aio.AioRpcError) as busy:
                await stub.QueryByKey(_query("busy"), timeout=5)
            assert retry_pushback_ms(busy.value) == 321

    asyncio.run(main())


def test_an_unknown_method_or_a_bad_payload_is_refused_by_name() -> None:
    async def main() -> None:
        async with _serving(_Index()) as (port, _), _client(port) as (mux, _stub):
            reply = await mux.invoke("/mqstore.v1.IndexService/NoSuchMethod", b"", 5)
            assert grpc.StatusCode.UNIMPLEMENTED.value[0] == reply.code
            assert "NoSuchMethod" in reply.details
            reply = await mux.invoke("/mqstore.v1.IndexService/QueryByKey", b"\xff\xff\xff", 5)
            assert grpc.StatusCode.INVALID_ARGUMENT.value[0] == reply.code
            assert mux.supported  # the stream itself is served

    asyncio.run(main())


def test_a_stream_runs_at_most_max_calls_at_once() -> None:
    async def main() -> None:
        async with _hold_serving(2) as (stub, started, release):
            calls = _holding(stub, range(3))
            await _until(lambda: len(started) == 2)
            await asyncio.sleep(0.2)
            assert sorted(started) == [0, 1]  # the third waits for a slot
            release.set()
            replies = await asyncio.gather(*calls)
            assert [list(r.phy_offsets) for r in replies] == [[0], [1], [2]]
            assert sorted(started) == [0, 1, 2]

    asyncio.run(main())


@asynccontextmanager
async def _hold_serving(
    max_calls: int,
) -> AsyncIterator[tuple[index_grpc.IndexServiceStub, list[int], asyncio.Event]]:
    """A client of a :func:`_hold_server` running ``max_calls`` calls at once: (stub, the ids of
    the calls held so far, the event that releases them)."""
    held: list[int] = []
    release = asyncio.Event()
    server, port = _hold_server(max_calls, held, release)
    await server.start()
    try:
        async with _client(port) as (_, stub):
            yield stub, held, release
    finally:
        await server.stop(None)


def _hold_server(max_calls: int, held: list[int], release: asyncio.Event) -> tuple[grpc.aio.Server, int]:
    """A bare server whose CallMux runs QueryByKey as: "hold" waits for ``release``, else echo."""

    async def query(request: index_pb.QueryByKeyRequest, context: object) -> index_pb.QueryByKeyResponse:
        if request.topic == "hold":
            held.append(request.max_count)
            await release.wait()
        return index_pb.QueryByKeyResponse(phy_offsets=[request.max_count])

    handler = grpc.unary_unary_rpc_method_handler(
        query,
        request_deserializer=index_pb.QueryByKeyRequest.FromString,
        response_serializer=index_pb.QueryByKeyResponse.SerializeToString,
    )
    server = grpc.aio.server()
    lookup = {"/mqstore.v1.IndexService/QueryByKey": handler}.get
    add_call_mux(CallMuxServicer(lookup, max_calls=max_calls), server)
    return server, server.add_insecure_port("127.0.0.1:0")


def _holding(stub: index_grpc.IndexServiceStub, ids: Iterable[int]) -> list[asyncio.Future[Any]]:
    """A "hold" call for each of ``ids`` (sent as max_count), running."""
    return [asyncio.ensure_future(stub.QueryByKey(_query("hold", i), timeout=10)) for i in ids]


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached within 5 s")


def test_a_full_stream_still_reads_a_cancel_reaches_a_waiting_call_and_calls_run_in_order() -> None:
    async def main() -> None:
        async with _hold_serving(2) as (stub, held, release):
            polls = _holding(stub, range(2))
            await _until(lambda: len(held) == 2)
            waiting, later = _holding(stub, (5, 6))
            await asyncio.sleep(0.2)
            waiting.cancel()  # its cancel is read although both slots are taken
            await asyncio.sleep(0.2)
            release.set()
            replies = await asyncio.gather(*polls, later)
            assert [list(r.phy_offsets) for r in replies] == [[0], [1], [6]]
            assert held == [0, 1, 6]  # the cancelled call never ran
            with pytest.raises(asyncio.CancelledError):
                await waiting

    asyncio.run(main())


def test_a_stopping_server_finishes_running_calls_and_refuses_new_ones_unrun() -> None:
    async def main() -> None:
        servicer = _Index()
        async with _serving(servicer) as (port, stop), _client(port) as (_, stub):
            assert list((await stub.QueryByKey(_query("echo", 1), timeout=5)).phy_offsets) == [1]
            running = asyncio.ensure_future(stub.QueryByKey(_query("slow", 2, begin_ms=400), timeout=10))
            await _until(lambda: 2 in servicer.ran)
            loop = asyncio.get_running_loop()
            started = loop.time()
            stopping = asyncio.ensure_future(stop(5))
            await asyncio.sleep(0.05)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.QueryByKey(_query("echo", 3), timeout=5)
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE  # safe to send again
            assert list((await running).phy_offsets) == [2]  # the call under way was answered
            await stopping
            assert loop.time() - started < 3  # not the whole grace: the stream ended
            assert 3 not in servicer.ran

    asyncio.run(main())


def test_a_failed_write_fails_waiting_calls_as_a_lost_connection() -> None:
    async def main() -> None:
        servicer = _Index()
        async with _serving(servicer) as (port, _), _client(port) as (mux, stub):
            assert list((await stub.QueryByKey(_query("echo", 1), timeout=5)).phy_offsets) == [1]
            stream = mux._stream
            assert stream is not None
            sent = asyncio.ensure_future(stub.QueryByKey(_query("slow", 2, begin_ms=500), timeout=5))
            await _until(lambda: 2 in servicer.ran)

            async def broken(request: object) -> None:
                raise RuntimeError("GRPC_CALL_ERROR_TOO_MANY_OPERATIONS")

            stream.call.write = broken
            failed = asyncio.ensure_future(stub.QueryByKey(_query("echo", 3), timeout=5))
            for call_future in (failed, sent):
                with pytest.raises(grpc.aio.AioRpcError) as lost:
                    await call_future
                assert lost.value.code() is grpc.StatusCode.UNAVAILABLE  # retried as a lost connection
                assert isinstance(store_error_from_rpc(lost.value), ServiceNotAvailableError)
            # The next call opens a new stream.
            assert list((await stub.QueryByKey(_query("echo", 4), timeout=5)).phy_offsets) == [4]
            assert mux._stream is not stream

    asyncio.run(main())


def test_a_handlers_own_abort_keeps_its_status() -> None:
    async def main() -> None:
        async with _serving(_Index()) as (port, _), _client(port) as (_, stub):
            with pytest.raises(grpc.aio.AioRpcError) as gone:
                await stub.QueryByKey(_query("gone", key="x"), timeout=5)
            assert gone.value.code() is grpc.StatusCode.NOT_FOUND
            assert gone.value.details() == "no topic for 'x'"

    asyncio.run(main())
