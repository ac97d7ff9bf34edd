"""A gRPC asyncio server as every mqstore service runs it: error mapping (and the gateway's
authentication) wrapped around each method once, when it is registered, rather than run as
interceptors on every call (grpc.aio then takes its cheaper path: no interceptor chain per call);
OpenTelemetry's per-RPC span interceptor only while an exporter is attached; the standard
health service (SERVING once the caller says so; ``mqstore.Liveness``
SERVING from the start, for liveness probes) and reflection.

Bind to port 0 to let the OS choose; :attr:`GrpcServer.port` tells which it chose. With a
:class:`~services._common.tls.TlsConfig` the port serves TLS only (optionally requiring client
certificates); ``health_address`` adds a plaintext port that serves nothing but the health
service, for probes that cannot speak TLS (Kubernetes' gRPC probes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from services._common.errors import MethodWrapper, map_errors
from services._common.mux import CallMuxServicer
from services._common.mux import add_to_server as add_call_mux
from services._common.telemetry import server_interceptors
from services._common.tls import TlsConfig
from services._common.wire import accepts_encoded_replies

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Health service name that is SERVING while the process answers (liveness/startup probes); the
# overall status "" turns SERVING only when the service is ready (readiness probes).
LIVENESS_SERVICE = "mqstore.Liveness"
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# gRPC binds with SO_REUSEPORT unless told otherwise: a second process started on a port that is
# already served would bind it too and the kernel would split the connections between the two
# (a client then meets the wrong service, UNIMPLEMENTED, or the wrong store). Off, the second bind
# fails and the process says so.
SERVER_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)]


@dataclass
class GrpcServer:
    """A started server: its bound ``port``, the health servicer and the service names."""

    server: grpc.aio.Server
    port: int
    health: HealthServicer
    service_names: list[str]
    host: str
    health_server: grpc.aio.Server | None = None
    health_port: int = 0
    call_mux: CallMuxServicer | None = None

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
        """NOT_SERVING, then stop taking calls and let running ones finish within ``grace_s``
        (calls on CallMux streams too: those streams refuse new calls and end, see
        services._common.mux)."""
        await self.set_serving(False)
        if self.call_mux is not None:
            self.call_mux.drain()
        await self.server.stop(grace_s)
        if self.health_server is not None:
            await self.health_server.stop(0)


async def start_grpc_server(
    address: str,
    add_servicers: Callable[[grpc.aio.Server], list[str]],
    *,
    tls: TlsConfig | None = None,
    require_client_auth: bool = False,
    clients: bool = False,
    health_address: str = "",
    wrappers: Sequence[MethodWrapper] = (),
    max_receive_bytes: int = MAX_MESSAGE_BYTES,
    call_mux: bool = False,
) -> GrpcServer:
    """Create, populate (``add_servicers`` registers servicers and returns their full service
    names), bind ``address`` ("host:port", port 0 for any) and start a server. Health starts
    NOT_SERVING: the owner switches it on when recovery is done.

    ``tls``: serve TLS with its certificate (plaintext when None); ``require_client_auth``: refuse
    handshakes without a client certificate signed by its CA (the clients' CA with ``clients``,
    for the gateway port; the internal one otherwise). ``health_address`` ("" for none): a
    second, plaintext server with only the health service (same statuses). ``wrappers`` wrap
    every method inside the error mapping, the first outermost (what they raise is mapped like
    a servicer's error). ``max_receive_bytes``: the largest request gRPC reads in (a larger one is refused,
    RESOURCE_EXHAUSTED, before it is buffered whole). Raises OSError when an address cannot be
    bound (another process serving that port included: SO_REUSEPORT is off), ConfigError for TLS
    settings that cannot serve. ``call_mux``: also serve mqstore.v1.CallMux, which carries
    unary calls of the servicers' methods on streams (services._common.mux; internal ports)."""
    options = [o for o in SERVER_OPTIONS if o[0] != "grpc.max_receive_message_length"]
    options.append(("grpc.max_receive_message_length", max_receive_bytes))
    server = grpc.aio.server(interceptors=server_interceptors() or None, options=options)
    # Innermost: the outer wrappers rebuild handlers around its serializer.
    wrapping = WrappingRegistrar(server, [map_errors, *wrappers, accepts_encoded_replies])
    registrar = cast(grpc.aio.Server, wrapping)
    names = add_servicers(registrar)
    mux = CallMuxServicer(wrapping.unary_handler) if call_mux else None
    if mux is not None:  # after the servicers: it carries calls of their registered unary methods
        names += add_call_mux(mux, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, registrar)
    # On the server itself: reflection picks its asyncio servicer by the server's type.
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
        server,
    )
    host, _, _ = address.rpartition(":")
    if tls is not None:
        credentials = tls.server_credentials(require_client_auth=require_client_auth, clients=clients)
        port = _bind(address, lambda: server.add_secure_port(address, credentials))
    else:
        port = _bind(address, lambda: server.add_insecure_port(address))
    health_server = None
    health_port = 0
    if health_address:
        health_server = grpc.aio.server(options=SERVER_OPTIONS)
        health_pb2_grpc.add_HealthServicer_to_server(health, health_server)
        health_port = _bind(health_address, lambda: health_server.add_insecure_port(health_address))
        await health_server.start()
    await server.start()
    running = GrpcServer(server, port, health, names, host or "127.0.0.1", health_server, health_port, mux)
    await running.set_serving(False)
    # Liveness (Kubernetes liveness and startup probes): SERVING as long as the process answers,
    # while the overall status ("") stays NOT_SERVING until recovery and catch-up are done.
    await health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    return running


def _bind(address: str, add_port: Callable[[], int]) -> int:
    """Run gRPC's add-port call for ``address``; its refusals (RuntimeError from recent grpcio,
    port 0 from older ones) become OSError naming the address."""
    try:
        port = add_port()
    except RuntimeError as exc:
        raise OSError(f"cannot bind {address}: in use or not an address of this host") from exc
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return port


class WrappingRegistrar:
    """Stands in for ``server`` while servicers register: every method handler they add (as a
    generic handler or as a registered method) is registered wrapped by ``wrappers``, the first
    outermost, each applied once per method. Anything else is the server's."""

    def __init__(self, server: grpc.aio.Server, wrappers: Sequence[MethodWrapper]) -> None:
        self._server = server
        self._wrappers = list(wrappers)
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}
        self._table: dict[str, grpc.RpcMethodHandler] | None = None  # registered methods, wrapped

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` of the full method name ``method``, wrapped (the same object each time)."""
        known = self._wrapped.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = handler
        for wrapper in reversed(self._wrappers):
            wrapped = wrapper(method, wrapped)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers([_WrappedGenericHandler(h, self.wrap) for h in handlers])

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        """Served through one generic handler (a dict of full method names), not as gRPC
        registered methods. grpc.aio keeps a pending request task per registered method and,
        for every call the server takes, waits on all of them (``asyncio.wait``, a done-callback
        added to and removed from each): 12 µs a call more with the 36 methods of an embedded
        suite than with the generic path's single pending request."""
        if self._table is None:
            self._table = {}
            self._server.add_generic_rpc_handlers([_MethodTable(self._table)])
        for name, handler in method_handlers.items():
            method = f"/{service_name}/{name}"
            self._table[method] = self.wrap(method, handler)

    def unary_handler(self, method: str) -> grpc.RpcMethodHandler | None:
        """The wrapped handler of the registered unary method ``method`` (full name), or None."""
        handler = self._table.get(method) if self._table is not None else None
        return handler if handler is not None and handler.unary_unary is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class _MethodTable(grpc.GenericRpcHandler):
    """Handlers by full method name ("/package.Service/Method")."""

    def __init__(self, table: Mapping[str, grpc.RpcMethodHandler]) -> None:
        self._table = table

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._table.get(handler_call_details.method)


class _WrappedGenericHandler(grpc.GenericRpcHandler):
    """A generic handler whose answers come wrapped (:meth:`WrappingRegistrar.wrap`)."""

    def __init__(
        self,
        inner: grpc.GenericRpcHandler,
        wrap: Callable[[str, grpc.RpcMethodHandler], grpc.RpcMethodHandler],
    ) -> None:
        self._inner = inner
        self._wrap = wrap

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        return self._wrap(handler_call_details.method, handler)
