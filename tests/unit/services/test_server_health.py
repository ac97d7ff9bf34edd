"""The health service as Kubernetes probes see it (services._common.server): before the owner
says it is ready, the overall status is NOT_SERVING (readiness fails) while the liveness service
is SERVING (liveness and startup probes pass); after, both are SERVING; and turning serving off
(what stop() does before it stops taking calls) turns only the overall status off."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services._common.server import LIVENESS_SERVICE, start_grpc_server

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_liveness_serves_before_readiness() -> None:
    async def scenario() -> None:
        server = await start_grpc_server("127.0.0.1:0", lambda s: [])
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)

            async def status(service: str) -> int:
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                return reply.status

            assert (await status(""), await status(LIVENESS_SERVICE)) == (NOT_SERVING, SERVING)
            await server.set_serving(True)
            assert (await status(""), await status(LIVENESS_SERVICE)) == (SERVING, SERVING)
            await server.set_serving(False)  # what stop() does first
            assert (await status(""), await status(LIVENESS_SERVICE)) == (NOT_SERVING, SERVING)
        await server.stop(0)

    asyncio.run(scenario())


def test_a_served_port_cannot_be_bound_twice() -> None:
    """A second server on a port that is already served fails to start (gRPC's SO_REUSEPORT
    is off): otherwise the kernel splits connections between the two and clients meet the
    wrong service."""

    async def scenario() -> None:
        first = await start_grpc_server("127.0.0.1:0", lambda s: [])
        try:
            with pytest.raises(OSError, match="cannot bind"):
                second = await start_grpc_server(f"127.0.0.1:{first.port}", lambda s: [])
                await second.stop(0)
        finally:
            await first.stop(0)

    asyncio.run(scenario())
