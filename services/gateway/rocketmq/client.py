"""RocketMQ 5 client sessions on the gateway: Telemetry, Heartbeat and NotifyClientTermination
(spec sheet rocketmq-grpc-v2 §5).

The client's settings are answered with the server's (status OK, limits, back-off, FIFO flag
from the group's config); the stream stays open until the client ends it or announces its
termination (services.gateway.rocketmq.sessions). Streams per client id and commands queued per
stream are bounded. A client that went away has what it held released
(services.gateway.rocketmq.renewal) unless the gateway itself is stopping.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc

from libstore import StoreError
from libstore.subscription_group import SubscriptionGroupConfig
from services.gateway.acl import PUB
from services.gateway.rocketmq import convert, namespace
from services.gateway.rocketmq.activity import NAMESPACE_HEADER, GatewayContext, metadata
from services.gateway.rocketmq.consume import MAX_LONG_POLLING_MS, MAX_RECEIVE_BATCH
from services.gateway.rocketmq.convert import V2Error
from services.gateway.rocketmq.error_status import error_status
from services.gateway.rocketmq.pb import definition, service
from services.gateway.rocketmq.sessions import ClientSession
from services.gateway.rocketmq.transaction import TransactionActivity

PRODUCER_BACKOFF = definition.RetryPolicy(
    max_attempts=3,
    exponential_backoff=definition.ExponentialBackoff(
        initial=convert.duration_ms(10), max=convert.duration_ms(1000), multiplier=2.0
    ),
)
# RocketMQ's consumer retry schedule (messageDelayLevel from level 3: 1s .. 2h).
CONSUMER_DELAYS_S = [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]


class ClientActivity:
    """Telemetry streams and the client's life over ``ctx`` (module docstring); check-backs go
    out through ``transactions``' loop, started by the first stream."""

    def __init__(self, ctx: GatewayContext, transactions: TransactionActivity) -> None:
        self.ctx = ctx
        self.transactions = transactions

    async def heartbeat(
        self, request: service.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> service.HeartbeatResponse:
        self.ctx.authorize(context)
        return service.HeartbeatResponse(status=convert.status())

    async def notify_client_termination(
        self, request: service.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> service.NotifyClientTerminationResponse:
        account = self.ctx.authorize(context)
        client_id = metadata(context, "x-mq-client-id")
        self.ctx.sessions.drop(client_id, account.access_key if account else "")
        if client_id and not self.ctx.sessions.has_client(client_id):
            await self.ctx.renewer.release_client(client_id, self.ctx.invisible_when_clear_ms)
        return service.NotifyClientTerminationResponse(status=convert.status())

    async def telemetry(
        self, request_iterator: AsyncIterator[service.TelemetryCommand], context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[service.TelemetryCommand, None]:
        client_id = metadata(context, "x-mq-client-id")
        if not client_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "x-mq-client-id metadata is required")
        try:
            account = self.ctx.authorize(context)
        except V2Error as exc:
            yield service.TelemetryCommand(status=convert.status(exc.code, str(exc)))
            return
        try:
            session = self.ctx.sessions.open(client_id, account.access_key if account else "")
        except StoreError as exc:
            yield service.TelemetryCommand(status=error_status(exc, "Telemetry"))
            return
        # The stream was authenticated when it opened; later settings are checked against that
        # account (its signature's date ages while the stream lives).
        if account is not None:
            session.may_publish = functools.partial(account.may, PUB)
        self.transactions.ensure_check_loop()
        ns = metadata(context, NAMESPACE_HEADER)
        reader = asyncio.create_task(self._read_telemetry(request_iterator, session, ns))
        try:
            while True:
                command = await session.next()
                if command is None:
                    break
                if ns:
                    namespace.unwrap_response(command, ns)
                yield command
        finally:
            reader.cancel()
            self.ctx.sessions.close(session)
            if not self.ctx.draining and not self.ctx.sessions.has_client(client_id):  # it went away
                task = asyncio.create_task(
                    self.ctx.renewer.release_client(client_id, self.ctx.invisible_when_clear_ms)
                )
                self.ctx.releases.add(task)
                task.add_done_callback(self.ctx.releases.discard)

    async def _read_telemetry(
        self, commands: AsyncIterator[service.TelemetryCommand], session: Any, ns: str = ""
    ) -> None:
        try:
            async for command in commands:
                if ns:
                    namespace.wrap_request(command)
                kind = command.WhichOneof("command")
                if kind == "settings":
                    reply = await self._settings_reply(command.settings, session)
                    await session.put(service.TelemetryCommand(status=convert.status(), settings=reply))
                # thread stack traces and verify results answer commands we never send
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            session.end()

    async def _settings_reply(
        self, settings: definition.Settings, session: ClientSession
    ) -> definition.Settings:
        reply = definition.Settings()
        reply.CopyFrom(settings)
        kind = settings.WhichOneof("pub_sub")
        if kind == "publishing":
            # Check-backs carry whole messages: only to producers that may publish to the topic.
            session.topics |= {t.name for t in settings.publishing.topics if session.may_publish(t.name)}
            reply.backoff_policy.CopyFrom(PRODUCER_BACKOFF)
            reply.publishing.max_body_size = convert.MAX_BODY_SIZE
            reply.publishing.validate_message_type = True
        elif kind == "subscription":
            group = settings.subscription.group.name
            config = await self.ctx.dispatch.get_group(group) if group else None
            sub = reply.subscription
            sub.fifo = bool(config and config.consume_message_orderly)
            sub.receive_batch_size = MAX_RECEIVE_BATCH
            if not sub.HasField("long_polling_timeout"):
                sub.long_polling_timeout.CopyFrom(convert.duration_ms(MAX_LONG_POLLING_MS))
            attempts = (config or SubscriptionGroupConfig(group)).max_delivery_attempts
            reply.backoff_policy.CopyFrom(
                definition.RetryPolicy(
                    max_attempts=attempts,
                    customized_backoff=definition.CustomizedBackoff(
                        next=[convert.duration_ms(s * 1000) for s in CONSUMER_DELAYS_S]
                    ),
                )
            )
        reply.metric.CopyFrom(definition.Metric(on=False))
        return reply

    def drain(self) -> int:
        """The gateway is about to stop: complete every Telemetry stream with OK, as a proxy's
        orderly shutdown does, so clients that reopen a completed stream (RocketMQ's Java
        client does a second later) find a gateway that is up; what they held is not released
        early (they keep working on it). Returns how many streams were ended."""
        self.ctx.draining = True
        return self.ctx.sessions.end_all()
