"""A gRPC asyncio server as every mqstore service runs it: tracing and error-mapping
interceptors, the standard health service (SERVING once the caller says so; ``mqstore.Liveness``
SERVING from the start, for liveness probes) and reflection.

Bind to port 0 to let the OS choose; :attr:`GrpcServer.port` tells which it chose.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from services._common.telemetry import server_interceptors

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Health service name that is SERVING while the process answers (liveness/startup probes); the
# overall status "" turns SERVING only when the service is ready (readiness probes).
LIVENESS_SERVICE = "mqstore.Liveness"
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


@dataclass
class GrpcServer:
    """A started server: its bound ``port``, the health servicer and the service names."""

    server: grpc.aio.Server
    port: int
    health: HealthServicer
    service_names: list[str]
    host: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING (or NOT_SERVING) for every service and the server as a whole."""
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *self.service_names]:
            await self.health.set(name, status)

    async def stop(self, grace_s: float = 5.0) -> None:
        """NOT_SERVING, then stop taking calls and let running ones finish within ``grace_s``."""
        await self.set_serving(False)
        await self.server.stop(grace_s)


async def start_grpc_server(
    address: str,
    add_servicers: Callable[[grpc.aio.Server], list[str]],
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> GrpcServer:
    """Create, populate (``add_servicers`` registers servicers and returns their full service
    names), bind ``address`` ("host:port", port 0 for any) and start a server. Health starts
    NOT_SERVING: the owner switches it on when recovery is done. ``interceptors`` run inside
    the tracing and error-mapping ones (so what they raise is mapped like a servicer's error)."""
    server = grpc.aio.server(interceptors=[*server_interceptors(), *interceptors], options=CHANNEL_OPTIONS)
    names = add_servicers(server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    host, _, _ = address.rpartition(":")
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    await server.start()
    running = GrpcServer(server, port, health, names, host or "127.0.0.1")
    await running.set_serving(False)
    # Liveness (Kubernetes liveness and startup probes): SERVING as long as the process answers,
    # while the overall status ("") stays NOT_SERVING until recovery and catch-up are done.
    await health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    return running
