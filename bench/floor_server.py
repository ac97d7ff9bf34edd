"""The bare-gRPC floor of the peers suite: a grpc.aio server with mqstore's Gateway service whose
Produce answers PUT_OK at once and stores nothing.

Our own client (services.client.Producer) against it costs what any Produce costs before the
store does anything: request encoding, HTTP/2 framing, the event loop and protobuf decoding. The
peers suite runs it as its own process (``python -m bench.floor_server --listen 127.0.0.1:PORT``)
so its CPU is read from /proc like the real server's. The server is deliberately bare: no
interceptors, no health service, default options apart from mqstore's message-size caps.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any

import grpc

from services._common.server import CHANNEL_OPTIONS
from services.proto import common_pb, gateway_grpc, gateway_pb


class FloorGateway(gateway_grpc.GatewayServicer):
    """Gateway whose Produce acknowledges every request as one appended message, doing nothing."""

    def __init__(self) -> None:
        self._reply = gateway_pb.ProduceResponse(
            results=common_pb.PutResults(
                count=1, appended=1, status=common_pb.PUT_OK, phy_offsets=[0], sizes=[0], queue_offsets=[0]
            )
        )

    async def Produce(
        self, request: gateway_pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb.ProduceResponse:
        """The same prebuilt PUT_OK reply for every request."""
        return self._reply


async def serve(listen: str, register: Callable[[grpc.aio.Server], None] | None = None) -> None:
    """Serve on ``listen`` (host:port) until SIGTERM or SIGINT: the servicers ``register`` adds
    (default: the do-nothing Gateway) on a bare server."""
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    if register is None:
        gateway_grpc.add_GatewayServicer_to_server(FloorGateway(), server)
    else:
        register(server)
    if server.add_insecure_port(listen) == 0:
        raise SystemExit(f"cannot listen on {listen}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)


def run_cli(
    module: str,
    description: str | None,
    serve_on: Callable[[str], Coroutine[Any, Any, None]],
    argv: list[str] | None,
) -> None:
    """A do-nothing server's command line, ``python -m <module> --listen HOST:PORT`` (loopback
    only in the benchmarks): runs ``serve_on(listen)`` until it returns."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--listen", required=True, help="host:port to serve on, e.g. 127.0.0.1:50051")
    asyncio.run(serve_on(parser.parse_args(argv).listen))


def main(argv: list[str] | None = None) -> None:
    """Command line: ``--listen HOST:PORT``."""
    run_cli("bench.floor_server", __doc__, serve, argv)


if __name__ == "__main__":
    main()
