"""MessagingServicer: Apache RocketMQ 5's ``apache.rocketmq.v2.MessagingService`` on the gateway,
so the official RocketMQ 5 clients work unchanged (spec sheet rocketmq-grpc-v2).

A thin dispatcher, as RocketMQ's proxy is over its MessagingProcessor: each call goes to the
activity that serves it, over the gateway's ports (services.gateway.rocketmq.activity):

* QueryRoute / QueryAssignment: services.gateway.rocketmq.route;
* SendMessage: services.gateway.rocketmq.send;
* ReceiveMessage / AckMessage / ChangeInvisibleDuration / ForwardMessageToDeadLetterQueue:
  services.gateway.rocketmq.consume;
* EndTransaction and the check-backs of half messages: services.gateway.rocketmq.transaction;
* Telemetry / Heartbeat / NotifyClientTermination: services.gateway.rocketmq.client.

Here each call's resource names are mapped to and from the client's namespace
(services.gateway.rocketmq.namespace). Business errors go in the response's Status and the call
returns OK (the proxy's contract); only a malformed Telemetry stream ends with a gRPC error.
Internal failures answer a generic message with a correlation id
(services.gateway.rocketmq.error_status).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from services.gateway.rocketmq import namespace
from services.gateway.rocketmq.activity import (
    NAMESPACE_HEADER,
    GatewayContext,
    metadata,
)
from services.gateway.rocketmq.client import ClientActivity
from services.gateway.rocketmq.consume import ConsumeActivity
from services.gateway.rocketmq.error_status import error_status
from services.gateway.rocketmq.pb import definition, service, service_grpc
from services.gateway.rocketmq.route import RouteActivity
from services.gateway.rocketmq.send import SendActivity
from services.gateway.rocketmq.transaction import TransactionActivity

R = TypeVar("R")


def _unary(response: Callable[[definition.Status], R]) -> Callable[..., Callable[..., Awaitable[R]]]:
    """Map the call's resources in and out of the client's namespace, and answer failures
    with ``response(status)`` (services.gateway.rocketmq.error_status) instead of failing the call."""

    def wrap(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        @functools.wraps(fn)
        async def handler(self: MessagingServicer, request: Any, context: grpc.aio.ServicerContext) -> R:
            try:
                ns = metadata(context, NAMESPACE_HEADER)
                if ns:
                    namespace.wrap_request(request)
                result = await fn(self, request, context)
                if ns and not isinstance(result, bytes):  # an encoded reply names no resource
                    namespace.unwrap_response(result, ns)  # type: ignore[arg-type]
                return result
            except Exception as exc:
                return response(error_status(exc, fn.__name__))

        return handler

    return wrap


class MessagingServicer(service_grpc.MessagingServiceServicer):
    """apache.rocketmq.v2.MessagingService over the gateway's ports and bounds in ``ctx``
    (module docstring)."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self.route = RouteActivity(ctx)
        self.send = SendActivity(ctx)
        self.consume = ConsumeActivity(ctx)
        self.transactions = TransactionActivity(ctx)
        self.clients = ClientActivity(ctx, self.transactions)

    # -- routes ---------------------------------------------------------------------------------------
    @_unary(lambda s: service.QueryRouteResponse(status=s))
    async def QueryRoute(
        self, request: service.QueryRouteRequest, context: grpc.aio.ServicerContext
    ) -> service.QueryRouteResponse:
        return await self.route.query_route(request, context)

    @_unary(lambda s: service.QueryAssignmentResponse(status=s))
    async def QueryAssignment(
        self, request: service.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> service.QueryAssignmentResponse:
        return await self.route.query_assignment(request, context)

    # -- client life --------------------------------------------------------------------------------
    @_unary(lambda s: service.HeartbeatResponse(status=s))
    async def Heartbeat(
        self, request: service.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> service.HeartbeatResponse:
        return await self.clients.heartbeat(request, context)

    @_unary(lambda s: service.NotifyClientTerminationResponse(status=s))
    async def NotifyClientTermination(
        self, request: service.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> service.NotifyClientTerminationResponse:
        return await self.clients.notify_client_termination(request, context)

    async def Telemetry(
        self, request_iterator: AsyncIterator[service.TelemetryCommand], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[service.TelemetryCommand]:
        # aclosing: when grpc.aio closes this stream, the activity's own cleanup runs at once.
        async with contextlib.aclosing(self.clients.telemetry(request_iterator, context)) as commands:
            async for command in commands:
                yield command

    # -- produce ----------------------------------------------------------------------------------------
    @_unary(lambda s: service.SendMessageResponse(status=s))
    async def SendMessage(
        self, request: service.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> service.SendMessageResponse | bytes:
        return await self.send.send_message(request, context)

    # -- consume ----------------------------------------------------------------------------------------
    async def ReceiveMessage(
        self, request: service.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[service.ReceiveMessageResponse]:
        # aclosing: a receive abandoned mid-answer gives back what it popped at once.
        async with contextlib.aclosing(self.consume.receive_message(request, context)) as responses:
            async for response in responses:
                yield response

    @_unary(lambda s: service.AckMessageResponse(status=s))
    async def AckMessage(
        self, request: service.AckMessageRequest, context: grpc.aio.ServicerContext
    ) -> service.AckMessageResponse | bytes:
        return await self.consume.ack_message(request, context)

    @_unary(lambda s: service.ChangeInvisibleDurationResponse(status=s))
    async def ChangeInvisibleDuration(
        self, request: service.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> service.ChangeInvisibleDurationResponse:
        return await self.consume.change_invisible_duration(request, context)

    @_unary(lambda s: service.ForwardMessageToDeadLetterQueueResponse(status=s))
    async def ForwardMessageToDeadLetterQueue(
        self, request: service.ForwardMessageToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> service.ForwardMessageToDeadLetterQueueResponse:
        return await self.consume.forward_to_dead_letter_queue(request, context)

    # -- transactions -----------------------------------------------------------------------------
    @_unary(lambda s: service.EndTransactionResponse(status=s))
    async def EndTransaction(
        self, request: service.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> service.EndTransactionResponse:
        return await self.transactions.end_transaction(request, context)

    # -- lifecycle ----------------------------------------------------------------------------------
    def drain(self) -> int:
        """The gateway is about to stop: complete every Telemetry stream with OK
        (ClientActivity.drain). Returns how many streams were ended."""
        return self.clients.drain()

    async def close(self) -> None:
        """Stop the check-back loop and the renewals (the server has stopped)."""
        await self.transactions.close()
        await self.ctx.renewer.close()


def add_to_server(servicer: MessagingServicer, server: grpc.aio.Server) -> list[str]:
    from services.gateway.rocketmq.pb import SERVICE_NAME

    service_grpc.add_MessagingServiceServicer_to_server(servicer, server)
    return [SERVICE_NAME]
