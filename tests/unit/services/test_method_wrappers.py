"""Method wrappers (services._common.server.WrappingRegistrar, services._common.errors.map_errors):
every method a servicer registers is wrapped once, at registration, the first wrapper
outermost; a call then goes through the wrapped handler with no per-call interceptor, and what
a servicer raises still reaches the client as its mapped status."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from libstore import InvalidArgumentError, TopicNotFoundError
from services._common.errors import error_info
from services._common.server import start_grpc_server

SERVICE = "test.Echo"


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    if request == b"bad":
        raise InvalidArgumentError("bad request")
    return request


async def _count(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for i in range(int(request)):
        yield str(i).encode()
    raise TopicNotFoundError("no more")


def _register(server: grpc.aio.Server) -> list[str]:
    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "Count": grpc.unary_stream_rpc_method_handler(_count),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
    return [SERVICE]


def test_methods_are_wrapped_once_outermost_first_and_errors_are_mapped() -> None:
    wrapped: list[tuple[str, str]] = []
    calls: list[str] = []

    def tagging(tag: str) -> Any:
        def wrap(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
            wrapped.append((tag, method))
            if handler.unary_unary is None:
                return handler
            inner = handler.unary_unary

            async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                calls.append(tag)
                return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(unary)

        return wrap

    async def scenario() -> None:
        server = await start_grpc_server(
            "127.0.0.1:0", _register, wrappers=[tagging("outer"), tagging("inner")]
        )
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                echo = channel.unary_unary(f"/{SERVICE}/Echo")
                for i in range(5):
                    assert await echo(b"x%d" % i, timeout=5) == b"x%d" % i
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await echo(b"bad", timeout=5)
                assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                info = error_info(refused.value)
                assert info is not None and info.reason == InvalidArgumentError.reason
                count = channel.unary_stream(f"/{SERVICE}/Count")
                got = []
                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    async for item in count(b"3", timeout=5):
                        got.append(item)
                assert got == [b"0", b"1", b"2"]  # the stream's items, then its error's status
                assert ended.value.code() is grpc.StatusCode.NOT_FOUND
        finally:
            await server.stop(0)

    asyncio.run(scenario())
    # Each method wrapped once by each wrapper (inner first: the first wrapper ends outermost),
    # whether it was registered as a generic handler, a registered method or both.
    mine = [(tag, m) for tag, m in wrapped if m.startswith(f"/{SERVICE}/")]
    assert sorted(mine) == sorted(
        [(tag, f"/{SERVICE}/{name}") for tag in ("outer", "inner") for name in ("Echo", "Count")]
    )
    assert mine.index(("inner", f"/{SERVICE}/Echo")) < mine.index(("outer", f"/{SERVICE}/Echo"))
    assert calls == ["outer", "inner"] * 6  # every call through both, outermost first


def test_registered_methods_are_served_through_one_generic_table() -> None:
    # grpc.aio waits on a pending task per registered method for every call it takes, so the
    # registrar serves registered methods through a generic handler instead: a servicer that
    # only registers its methods (no generic handler) is still reachable, wrapped, and the
    # server itself is given no registered method.
    given: list[str] = []
    calls: list[str] = []

    def counting(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        inner = handler.unary_unary
        if inner is None:
            return handler

        async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            calls.append(method)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary)

    def register_only(server: grpc.aio.Server) -> list[str]:
        server.add_registered_method_handlers(SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(_echo)})
        return [SERVICE]

    async def scenario() -> None:
        real = grpc.aio.server

        def spying_server(*args: Any, **kwargs: Any) -> grpc.aio.Server:
            server = real(*args, **kwargs)
            inner = server.add_registered_method_handlers
            server.add_registered_method_handlers = (  # type: ignore[method-assign]
                lambda name, handlers: (given.append(name), inner(name, handlers))[1]
            )
            return server

        grpc.aio.server = spying_server  # type: ignore[assignment]
        try:
            server = await start_grpc_server("127.0.0.1:0", register_only, wrappers=[counting])
        finally:
            grpc.aio.server = real  # type: ignore[assignment]
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                echo = channel.unary_unary(f"/{SERVICE}/Echo")
                assert await echo(b"hello", timeout=5) == b"hello"
                unknown = channel.unary_unary(f"/{SERVICE}/Nope")
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await unknown(b"x", timeout=5)
                assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
        finally:
            await server.stop(0)

    asyncio.run(scenario())
    assert calls == [f"/{SERVICE}/Echo"]
    # Only reflection, which registers on the server itself, reaches it as registered methods.
    assert given == ["grpc.reflection.v1alpha.ServerReflection"]
