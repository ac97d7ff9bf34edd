"""The official client's ceiling: a grpc.aio server with RocketMQ 5's MessagingService that answers
at once and stores nothing.

The official Python client against it costs what any send or receive costs before a broker does
anything: the client's own work, request encoding, HTTP/2 framing and protobuf decoding. Routes
name one queue of the asked topic on this server; SendMessage acknowledges every message with
its own id; ReceiveMessage hands out the batch asked for (up to 32) of one prebuilt 1 KiB message;
AckMessage acknowledges every entry; Telemetry echoes the client's settings. The rocketmq suite
runs it as its own process (``python -m bench.floor_messaging --listen 127.0.0.1:PORT``), next to
the gateway, with the same client processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from bench import floor_server
from libstore.message import MessageRecord
from services.gateway.rocketmq import convert
from services.gateway.rocketmq.client import PRODUCER_BACKOFF
from services.gateway.rocketmq.consume import MAX_LONG_POLLING_MS, MAX_RECEIVE_BATCH
from services.gateway.rocketmq.pb import definition, service, service_grpc

BODY = bytes(1024)


def _message() -> definition.Message:
    record = MessageRecord(
        total_size=0,
        magic_code=0,
        body_crc=0,
        queue_id=0,
        flag=0,
        queue_offset=0,
        phy_offset=0,
        sys_flag=0,
        born_timestamp=0,
        born_host=("127.0.0.1", 0),
        store_timestamp=0,
        store_host=("127.0.0.1", 0),
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=BODY,
        topic="floor",
        msg_id="01000000000000000000000000000000",
    )
    return convert.consumer_message(
        record, namespace="", receipt_handle="floor-handle", attempt=1, invisible_ms=30_000
    )


def _settings_reply(settings: definition.Settings) -> definition.Settings:
    """What the gateway answers (body size limit, batch, back-off, metrics off), without looking
    anything up: the client then works as it does against the gateway."""
    reply = definition.Settings()
    reply.CopyFrom(settings)
    if settings.WhichOneof("pub_sub") == "publishing":
        reply.backoff_policy.CopyFrom(PRODUCER_BACKOFF)
        reply.publishing.max_body_size = convert.MAX_BODY_SIZE
        reply.publishing.validate_message_type = True
    elif settings.WhichOneof("pub_sub") == "subscription":
        reply.subscription.receive_batch_size = MAX_RECEIVE_BATCH
        if not reply.subscription.HasField("long_polling_timeout"):
            reply.subscription.long_polling_timeout.CopyFrom(convert.duration_ms(MAX_LONG_POLLING_MS))
    reply.metric.CopyFrom(definition.Metric(on=False))
    return reply


class FloorMessaging(service_grpc.MessagingServiceServicer):
    """MessagingService that answers every call at once (module docstring)."""

    def __init__(self, host: str, port: int) -> None:
        self._endpoints = definition.Endpoints(
            scheme=definition.IPv4, addresses=[definition.Address(host=host, port=port)]
        )
        self._ok = convert.status()
        self._message = _message()

    async def QueryRoute(
        self, request: service.QueryRouteRequest, context: grpc.aio.ServicerContext
    ) -> service.QueryRouteResponse:
        queue = definition.MessageQueue(
            topic=request.topic,
            id=0,
            permission=definition.READ_WRITE,
            broker=definition.Broker(name="floor", id=0, endpoints=self._endpoints),
            accept_message_types=[definition.NORMAL],
        )
        return service.QueryRouteResponse(status=self._ok, message_queues=[queue])

    async def QueryAssignment(
        self, request: service.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> service.QueryAssignmentResponse:
        queue = definition.MessageQueue(
            topic=request.topic,
            id=-1,
            permission=definition.READ_WRITE,
            broker=definition.Broker(name="floor", id=0, endpoints=self._endpoints),
            accept_message_types=[definition.NORMAL],
        )
        return service.QueryAssignmentResponse(
            status=self._ok, assignments=[definition.Assignment(message_queue=queue)]
        )

    async def Heartbeat(
        self, request: service.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> service.HeartbeatResponse:
        return service.HeartbeatResponse(status=self._ok)

    async def NotifyClientTermination(
        self, request: service.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> service.NotifyClientTerminationResponse:
        return service.NotifyClientTerminationResponse(status=self._ok)

    async def SendMessage(
        self, request: service.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> service.SendMessageResponse:
        entries = [
            service.SendResultEntry(status=self._ok, message_id=m.system_properties.message_id)
            for m in request.messages
        ]
        return service.SendMessageResponse(status=self._ok, entries=entries)

    async def ReceiveMessage(
        self, request: service.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[service.ReceiveMessageResponse]:
        yield service.ReceiveMessageResponse(status=self._ok)
        message = self._message
        message.topic.CopyFrom(request.message_queue.topic)
        for _ in range(min(request.batch_size or 32, 32)):
            yield service.ReceiveMessageResponse(message=message)
        yield service.ReceiveMessageResponse(delivery_timestamp=convert.timestamp_ms(0))

    async def AckMessage(
        self, request: service.AckMessageRequest, context: grpc.aio.ServicerContext
    ) -> service.AckMessageResponse:
        entries = [
            service.AckMessageResultEntry(
                status=self._ok, message_id=e.message_id, receipt_handle=e.receipt_handle
            )
            for e in request.entries
        ]
        return service.AckMessageResponse(status=self._ok, entries=entries)

    async def Telemetry(
        self, request_iterator: AsyncIterator[service.TelemetryCommand], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[service.TelemetryCommand]:
        async for command in request_iterator:
            if command.HasField("settings"):
                yield service.TelemetryCommand(status=self._ok, settings=_settings_reply(command.settings))


async def serve(listen: str) -> None:
    """Serve on ``listen`` (host:port) until SIGTERM or SIGINT (bench.floor_server's loop)."""
    host, _, port = listen.rpartition(":")
    servicer = FloorMessaging(host, int(port))
    await floor_server.serve(
        listen, lambda server: service_grpc.add_MessagingServiceServicer_to_server(servicer, server)
    )


def main(argv: list[str] | None = None) -> None:
    """Command line: ``--listen HOST:PORT``."""
    floor_server.run_cli("bench.floor_messaging", __doc__, serve, argv)


if __name__ == "__main__":
    main()
