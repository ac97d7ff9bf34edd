"""RocketMQ 5 routes on the gateway: QueryRoute and QueryAssignment (spec sheet rocketmq-grpc-v2 §2).

A topic's queues are on this broker group (broker id 0), at the endpoints the client used to
reach us (numeric IPv4, else DOMAIN_NAME, which takes one address), or the advertised ones;
permissions come from the topic's perm bits, accepted message types from its message type. An
assignment is one queue, id -1: a receive serves every queue of the topic.
"""

from __future__ import annotations

import ipaddress

import grpc

from libstore.topic_config import TopicConfig
from services.gateway.acl import PUB, SUB
from services.gateway.rocketmq import convert
from services.gateway.rocketmq.activity import GatewayContext
from services.gateway.rocketmq.convert import V2Error
from services.gateway.rocketmq.pb import Code, definition, service


def _is_ipv4(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        return False


class RouteActivity:
    """QueryRoute and QueryAssignment over ``ctx`` (module docstring). Raises V2Error."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    def _endpoints(self, requested: definition.Endpoints | None) -> definition.Endpoints:
        if requested is not None and requested.addresses:
            addresses = [(a.host, a.port) for a in requested.addresses]
        else:
            addresses = self.ctx.endpoints
        numeric = all(_is_ipv4(h) for h, _ in addresses)
        if not numeric:
            addresses = addresses[:1]  # DOMAIN_NAME takes one address (spec §2)
        return definition.Endpoints(
            scheme=definition.IPv4 if numeric else definition.DOMAIN_NAME,
            addresses=[definition.Address(host=h, port=p) for h, p in addresses],
        )

    def _queues(
        self, topic: definition.Resource, config: TopicConfig, endpoints: definition.Endpoints
    ) -> list[definition.MessageQueue]:
        broker = definition.Broker(name=self.ctx.broker_name, id=0, endpoints=endpoints)
        out = []
        for qid in range(max(config.read_queue_nums, config.write_queue_nums)):
            readable = config.readable and qid < config.read_queue_nums
            writable = config.writeable and qid < config.write_queue_nums
            perm = (
                definition.READ_WRITE
                if readable and writable
                else definition.READ
                if readable
                else definition.WRITE
                if writable
                else definition.NONE
            )
            out.append(
                definition.MessageQueue(
                    topic=topic,
                    id=qid,
                    permission=perm,
                    broker=broker,
                    accept_message_types=convert.ACCEPT_TYPES[config.message_type],
                )
            )
        return out

    async def query_route(
        self, request: service.QueryRouteRequest, context: grpc.aio.ServicerContext
    ) -> service.QueryRouteResponse:
        self.ctx.authorize(context, PUB | SUB, request.topic.name)
        config = await self.ctx.topic(request.topic.name)
        endpoints = self._endpoints(request.endpoints if request.HasField("endpoints") else None)
        return service.QueryRouteResponse(
            status=convert.status(), message_queues=self._queues(request.topic, config, endpoints)
        )

    async def query_assignment(
        self, request: service.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> service.QueryAssignmentResponse:
        self.ctx.authorize(context, SUB, request.topic.name, request.group.name)
        config = await self.ctx.topic(request.topic.name)
        if not config.readable or config.read_queue_nums <= 0:
            raise V2Error(Code.FORBIDDEN, f"topic {config.topic_name} has no readable queue")
        endpoints = self._endpoints(request.endpoints if request.HasField("endpoints") else None)
        queue = definition.MessageQueue(
            topic=request.topic,
            id=-1,  # any queue: a receive serves every queue of the topic
            permission=definition.READ_WRITE if config.writeable else definition.READ,
            broker=definition.Broker(name=self.ctx.broker_name, id=0, endpoints=endpoints),
            accept_message_types=convert.ACCEPT_TYPES[config.message_type],
        )
        return service.QueryAssignmentResponse(
            status=convert.status(), assignments=[definition.Assignment(message_queue=queue)]
        )
