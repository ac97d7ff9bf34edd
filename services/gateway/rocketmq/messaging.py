"""MessagingServicer: Apache RocketMQ 5's ``apache.rocketmq.v2.MessagingService`` on the gateway,
so the official RocketMQ 5 clients work unchanged (spec sheet rocketmq-grpc-v2).

A thin translation over the gateway's ports, like the mqstore.v1 Gateway:

* QueryRoute / QueryAssignment: the topic's queues on this broker group (broker id 0), at the
  endpoints the client used to reach us (numeric IPv4, else DOMAIN_NAME), or the advertised ones;
  permissions from the topic's perm bits, accepted message types from its message type.
* SendMessage: v2 messages become store messages (services.gateway.rocketmq.convert); a message
  group picks its queue by hash (FIFO), other messages are placed round robin by the commitlog;
  one entry per message. A delivery time is held by the commitlog's timer topic; TRANSACTION
  messages become half messages (libstore.transaction_message), ended by EndTransaction or by a
  check-back pushed to a producer over Telemetry.
* ReceiveMessage / AckMessage / ChangeInvisibleDuration / ForwardMessageToDeadLetterQueue: the
  pop model kept by the dispatch service (services.dispatch.pop). Delivery state is not held
  here, so gateways are interchangeable; the exception is a push consumer's renewal of invisible
  time (services.gateway.rocketmq.renewal), which lives with the gateway that served the
  receive: after that gateway goes away, an ack with the original handle is refused and the
  message comes back after its invisible time (at-least-once).
* Telemetry: the client's settings are answered with the server's (status OK, limits, back-off,
  FIFO flag from the group's config); the stream stays open until the client ends it or
  announces its termination (services.gateway.rocketmq.sessions).
* Heartbeat / NotifyClientTermination: OK.

Business errors go in the response's Status and the call returns OK (the proxy's contract);
only a malformed Telemetry stream ends with a gRPC error. Internal failures answer a generic
message with a correlation id (services.gateway.rocketmq.error_status). Bounds
(services.gateway.limits): messages and bytes per send, long polls held per client and in
total (TOO_MANY_REQUESTS past them when nothing is there to deliver), Telemetry streams per
client id and commands queued per stream (services.gateway.rocketmq.sessions); a send the
gateway cannot keep up with is refused before anything is written (TOO_MANY_REQUESTS,
services.gateway.admission).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import ipaddress
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from libstore import InvalidArgumentError, StoreError
from libstore.errors import AuthenticationError, MessageIllegalError, PermissionDeniedError
from libstore.message import MessageConst
from libstore.message_filter import TagFilter
from libstore.producer_input import check_producer_topic
from libstore.record_codec import decode_record
from libstore.subscription_group import SubscriptionGroupConfig
from libstore.system_topics import HALF_TOPIC
from libstore.topic_config import TopicConfig
from libstore.transaction_message import TransactionId, half_message
from services._common import convert as common_convert
from services._common import message_trace
from services._common.telemetry import tracer
from services.gateway.acl import PUB, SUB, AccessControl, Account
from services.gateway.admission import ProduceAdmission
from services.gateway.limits import GatewayLimits, HeldPolls
from services.gateway.metrics import get_metrics
from services.gateway.rocketmq import convert, namespace
from services.gateway.rocketmq.convert import V2Error
from services.gateway.rocketmq.error_status import error_status
from services.gateway.rocketmq.pb import Code, definition, service, service_grpc
from services.gateway.rocketmq.renewal import HandleRenewer
from services.gateway.rocketmq.sessions import ClientSession, ClientSessions
from services.gateway.servicer import TopicCache
from services.gateway.signature import authenticate_v2, metadata_dict
from services.ports import NACK_INVISIBLE_MS, CommitLogPort, DispatchPort, TransactionCheck

log = logging.getLogger(__name__)
R = TypeVar("R")

DEFAULT_INVISIBLE_MS = 60_000  # a push consumer's receive names no invisible time (the proxy's default)
# What a receive without auto-renewal may ask for (the proxy's minInvisibleTimeMillsForRecv and
# maxInvisibleTimeMills); a change of invisible time may go down to 0.
INVISIBLE_BOUNDS_MS = (10_000, 12 * 3600 * 1000)
MAX_RECEIVE_BATCH = 32
MAX_LONG_POLLING_MS = 20_000
NAMESPACE_HEADER = "x-mq-namespace"  # a client's resource namespace (services.gateway.rocketmq.namespace)
CHECK_POLL_S = 1.0  # how often a gateway with producers claims transaction check-backs
DEADLINE_MARGIN_MS = 800  # end a long poll this long before the client's deadline

PRODUCER_BACKOFF = definition.RetryPolicy(
    max_attempts=3,
    exponential_backoff=definition.ExponentialBackoff(
        initial=convert.duration_ms(10), max=convert.duration_ms(1000), multiplier=2.0
    ),
)
# RocketMQ's consumer retry schedule (messageDelayLevel from level 3: 1s .. 2h).
CONSUMER_DELAYS_S = [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _error_status(exc: Exception, rpc: str) -> definition.Status:
    """The Status a failed RPC answers with: the proxy's code, the message for the client's own
    errors, a generic one (details logged) for the rest (see error_status)."""
    return error_status(exc, rpc)


def _overall(statuses: list[definition.Status], what: str) -> definition.Status:
    """One status for several entries: OK when all are, the entry's own when there is one,
    else MULTIPLE_RESULTS."""
    failed = [s for s in statuses if s.code != Code.OK]
    if not failed:
        return convert.status()
    if len(statuses) == 1:
        return failed[0]
    return convert.status(Code.MULTIPLE_RESULTS, f"{len(failed)} of {len(statuses)} {what} failed")


def _unary(response: Callable[[definition.Status], R]) -> Callable[..., Callable[..., Awaitable[R]]]:
    """Answer failures with ``response(status)`` (:func:`_error_status`) instead of failing the call."""

    def wrap(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        @functools.wraps(fn)
        async def handler(self: MessagingServicer, request: Any, context: grpc.aio.ServicerContext) -> R:
            try:
                ns = _metadata(context, NAMESPACE_HEADER)
                if ns:
                    namespace.wrap_request(request)
                result = await fn(self, request, context)
                if ns:
                    namespace.unwrap_response(result, ns)  # type: ignore[arg-type]
                return result
            except Exception as exc:
                return response(_error_status(exc, fn.__name__))

        return handler

    return wrap


def _is_ipv4(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        return False


def _address(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def _metadata(context: grpc.aio.ServicerContext, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode()
    return ""


class MessagingServicer(service_grpc.MessagingServiceServicer):
    """apache.rocketmq.v2.MessagingService over the gateway's ports. ``endpoints``: addresses
    to advertise in routes when the client's access point is not usable as one."""

    def __init__(
        self,
        commitlog: CommitLogPort,
        dispatch: DispatchPort,
        *,
        endpoints: list[str],
        topics: TopicCache | None = None,
        broker_name: str = "broker-a",
        acl: AccessControl | None = None,
        default_invisible_ms: int = DEFAULT_INVISIBLE_MS,
        invisible_bounds_ms: tuple[int, int] = INVISIBLE_BOUNDS_MS,
        invisible_when_clear_ms: int = 1000,
        renew_ahead_ms: int = 10_000,
        renew_max_ms: int = 3 * 3600 * 1000,
        limits: GatewayLimits | None = None,
        held_polls: HeldPolls | None = None,
        admission: ProduceAdmission | None = None,
    ) -> None:
        self.commitlog = commitlog
        self.dispatch = dispatch
        self.endpoints = [_address(e) for e in endpoints]
        self.topics = topics or TopicCache(commitlog)
        self.broker_name = broker_name
        self.acl = acl
        self.limits = limits = limits or GatewayLimits()
        self.held_polls = held_polls or HeldPolls(limits.max_held_polls, limits.max_held_polls_per_client)
        self.admission = admission or ProduceAdmission.of(limits)
        self.sessions = ClientSessions(
            max_streams=limits.telemetry_max_streams_per_client,
            outbox_max=limits.telemetry_outbox_max_commands,
        )
        self._check_task: asyncio.Task[None] | None = None
        self.default_invisible_ms = default_invisible_ms
        self.invisible_bounds_ms = invisible_bounds_ms
        self.invisible_when_clear_ms = invisible_when_clear_ms  # a departed client's deliveries
        self._releases: set[asyncio.Task[int]] = set()
        self._draining = False  # set by drain(): streams end because the gateway stops
        self.renewer = HandleRenewer(
            dispatch,
            self.sessions.has_client,
            slice_ms=default_invisible_ms,
            ahead_ms=renew_ahead_ms,
            max_ms=renew_max_ms,
        )
        self._tracer = tracer("mqstore.gateway")
        self._get_metrics = get_metrics()

    def _check_invisible(self, invisible_ms: int, least_ms: int) -> None:
        """Raise V2Error ILLEGAL_INVISIBLE_TIME outside [``least_ms``, maxInvisibleTimeMills]
        (the proxy's bounds and code)."""
        most_ms = self.invisible_bounds_ms[1]
        if invisible_ms < least_ms:
            raise V2Error(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"the invisible time {invisible_ms} ms is too small: at least {least_ms} ms "
                "(minInvisibleTimeMillsForRecv)",
            )
        if most_ms > 0 and invisible_ms > most_ms:
            raise V2Error(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"the invisible time {invisible_ms} ms is too large: at most {most_ms} ms "
                "(maxInvisibleTimeMills)",
            )

    def _authorize(
        self, context: grpc.aio.ServicerContext, perm: int = 0, topic: str = "", group: str = ""
    ) -> Account | None:
        """With ACL on: the call must be signed by a known key (within the clock-skew window)
        holding ``perm`` (acl.PUB/SUB, both: either) on ``topic`` and consuming as ``group``;
        returns its account (None with the ACL off). Raises V2Error UNAUTHORIZED/FORBIDDEN."""
        if self.acl is None:
            return None
        try:
            account = authenticate_v2(self.acl, metadata_dict(context.invocation_metadata()))
            AccessControl.authorize(account, perm, topic, group)
        except AuthenticationError as exc:
            raise V2Error(Code.UNAUTHORIZED, str(exc)) from None
        except PermissionDeniedError as exc:
            raise V2Error(Code.FORBIDDEN, str(exc)) from None
        return account

    # -- routes ---------------------------------------------------------------------------------------
    async def _topic(self, name: str) -> TopicConfig:
        if not name:
            raise V2Error(Code.ILLEGAL_TOPIC, "topic name is empty")
        config = await self.topics.get(name)
        if config is None:
            raise V2Error(Code.TOPIC_NOT_FOUND, f"topic {name} does not exist")
        return config

    def _endpoints(self, requested: definition.Endpoints | None) -> definition.Endpoints:
        if requested is not None and requested.addresses:
            addresses = [(a.host, a.port) for a in requested.addresses]
        else:
            addresses = self.endpoints
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
        broker = definition.Broker(name=self.broker_name, id=0, endpoints=endpoints)
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

    @_unary(lambda s: service.QueryRouteResponse(status=s))
    async def QueryRoute(
        self, request: service.QueryRouteRequest, context: grpc.aio.ServicerContext
    ) -> service.QueryRouteResponse:
        self._authorize(context, PUB | SUB, request.topic.name)
        config = await self._topic(request.topic.name)
        endpoints = self._endpoints(request.endpoints if request.HasField("endpoints") else None)
        return service.QueryRouteResponse(
            status=convert.status(), message_queues=self._queues(request.topic, config, endpoints)
        )

    @_unary(lambda s: service.QueryAssignmentResponse(status=s))
    async def QueryAssignment(
        self, request: service.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> service.QueryAssignmentResponse:
        self._authorize(context, SUB, request.topic.name, request.group.name)
        config = await self._topic(request.topic.name)
        if not config.readable or config.read_queue_nums <= 0:
            raise V2Error(Code.FORBIDDEN, f"topic {config.topic_name} has no readable queue")
        endpoints = self._endpoints(request.endpoints if request.HasField("endpoints") else None)
        queue = definition.MessageQueue(
            topic=request.topic,
            id=-1,  # any queue: a receive serves every queue of the topic
            permission=definition.READ_WRITE if config.writeable else definition.READ,
            broker=definition.Broker(name=self.broker_name, id=0, endpoints=endpoints),
            accept_message_types=convert.ACCEPT_TYPES[config.message_type],
        )
        return service.QueryAssignmentResponse(
            status=convert.status(), assignments=[definition.Assignment(message_queue=queue)]
        )

    # -- client life --------------------------------------------------------------------------------
    @_unary(lambda s: service.HeartbeatResponse(status=s))
    async def Heartbeat(
        self, request: service.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> service.HeartbeatResponse:
        self._authorize(context)
        return service.HeartbeatResponse(status=convert.status())

    @_unary(lambda s: service.NotifyClientTerminationResponse(status=s))
    async def NotifyClientTermination(
        self, request: service.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> service.NotifyClientTerminationResponse:
        account = self._authorize(context)
        client_id = _metadata(context, "x-mq-client-id")
        self.sessions.drop(client_id, account.access_key if account else "")
        if client_id and not self.sessions.has_client(client_id):
            await self.renewer.release_client(client_id, self.invisible_when_clear_ms)
        return service.NotifyClientTerminationResponse(status=convert.status())

    async def Telemetry(
        self, request_iterator: AsyncIterator[service.TelemetryCommand], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[service.TelemetryCommand]:
        client_id = _metadata(context, "x-mq-client-id")
        if not client_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "x-mq-client-id metadata is required")
        try:
            account = self._authorize(context)
        except V2Error as exc:
            yield service.TelemetryCommand(status=convert.status(exc.code, str(exc)))
            return
        try:
            session = self.sessions.open(client_id, account.access_key if account else "")
        except StoreError as exc:
            yield service.TelemetryCommand(status=_error_status(exc, "Telemetry"))
            return
        # The stream was authenticated when it opened; later settings are checked against that
        # account (its signature's date ages while the stream lives).
        if account is not None:
            session.may_publish = functools.partial(account.may, PUB)
        self._ensure_check_loop()
        ns = _metadata(context, NAMESPACE_HEADER)
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
            self.sessions.close(session)
            if not self._draining and not self.sessions.has_client(client_id):  # it went away
                task = asyncio.create_task(
                    self.renewer.release_client(client_id, self.invisible_when_clear_ms)
                )
                self._releases.add(task)
                task.add_done_callback(self._releases.discard)

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
            config = await self.dispatch.get_group(group) if group else None
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

    # -- produce ----------------------------------------------------------------------------------------
    @_unary(lambda s: service.SendMessageResponse(status=s))
    async def SendMessage(
        self, request: service.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> service.SendMessageResponse:
        if not request.messages:
            raise V2Error(Code.BAD_REQUEST, "no message to send")
        problem = self.limits.request_problem(len(request.messages), 0)
        if problem:
            raise V2Error(Code.BAD_REQUEST, problem)
        size = request.ByteSize()
        problem = self.limits.request_problem(0, size)
        if problem:
            raise V2Error(Code.MESSAGE_BODY_TOO_LARGE, problem)
        with self.admission.admit(size), self._tracer.start_as_current_span("gateway.v2.send") as span:
            span.set_attribute("mqstore.messages", len(request.messages))
            peer_ip, _ = common_convert.peer_host(context.peer())
            now = _now_ms()
            configs: dict[str, TopicConfig] = {}
            for name in {m.topic.name for m in request.messages}:
                try:
                    check_producer_topic(name)
                except MessageIllegalError as exc:
                    raise V2Error(Code.ILLEGAL_TOPIC, str(exc)) from None
                self._authorize(context, PUB, name)
                config = configs[name] = await self._topic(name)
                if not config.writeable:
                    raise V2Error(Code.FORBIDDEN, f"topic {config.topic_name} is not writeable")
            messages, ids = [], []
            half_topics: set[str] = set()
            for m in request.messages:
                config = configs[m.topic.name]
                msg, mtype, group = convert.store_message(m, peer_ip=peer_ip, now_ms=now)
                allowed = convert.ACCEPT_TYPES[config.message_type]
                if mtype not in allowed:
                    raise V2Error(
                        Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                        f"topic {config.topic_name} takes {config.message_type.value} messages, "
                        f"not {definition.MessageType.Name(mtype)}",
                    )
                msg.queue_id = self._queue_for(config, group)
                if mtype == definition.TRANSACTION:
                    # Held as a half message until EndTransaction (or a check-back) resolves it;
                    # a delay (DELAY/TIMER_* properties) is held by the commitlog's timer topic.
                    msg = half_message(msg)
                    half_topics.add(m.topic.name)
                messages.append(msg)
                ids.append(m.system_properties.message_id)
            if half_topics:
                self.sessions.add_topics(_metadata(context, "x-mq-client-id"), half_topics)
            results = await self.commitlog.append(messages)
            entries = []
            for r, msg, mid in zip(results, messages, ids, strict=True):
                code = convert.PUT_STATUS_TO_CODE.get(r.status, Code.INTERNAL_SERVER_ERROR)
                tid = ""
                if msg.topic == HALF_TOPIC and r.status.appended:
                    tid = TransactionId(r.queue_offset, r.phy_offset, r.size).encode()
                entries.append(
                    service.SendResultEntry(
                        status=convert.status(code, r.status.name),
                        message_id=mid,
                        transaction_id=tid,
                        offset=max(r.queue_offset, 0),
                    )
                )
            top = _overall([e.status for e in entries], "messages")
            span.set_attribute("mqstore.status", definition.Code.Name(top.code))
            return service.SendMessageResponse(status=top, entries=entries)

    @staticmethod
    def _queue_for(config: TopicConfig, group: str) -> int:
        """A message group's queue (its order is the queue's order); -1 (the commitlog places
        it round robin) without one."""
        if not group:
            return -1
        return int.from_bytes(hashlib.sha256(group.encode()).digest()[:8], "big") % max(
            config.write_queue_nums, 1
        )

    # -- consume ----------------------------------------------------------------------------------------
    async def ReceiveMessage(
        self, request: service.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[service.ReceiveMessageResponse]:
        """What was popped for a call that does not get it out (the client cancelled or went
        away meanwhile, or the answer failed) is given back: visible again in
        NACK_INVISIBLE_MS, as RocketMQ's proxy nacks a message it could not write, instead of
        hidden for its whole invisible time; messages already sent are not. A cancellation
        while the pop waits or the records are read lands here at once; one while grpc.aio
        sends a yielded response, when the abandoned generator is closed."""
        ns = _metadata(context, NAMESPACE_HEADER)
        taken: list[str] = []  # receipt handles popped for this call
        sent: set[str] = set()  # those of messages grpc.aio has sent
        answered = False
        try:
            try:
                if ns:
                    namespace.wrap_request(request)
                responses = await self._receive(request, context, taken)
            except Exception as exc:
                if taken:  # popped, then failed before any of it was answered: not delivered
                    self._give_back(request.group.name, request.message_queue.topic.name, taken)
                    taken = []
                responses = [
                    service.ReceiveMessageResponse(status=_error_status(exc, "ReceiveMessage")),
                    service.ReceiveMessageResponse(delivery_timestamp=convert.timestamp_ms(_now_ms())),
                ]
            for r in responses:
                if ns:
                    namespace.unwrap_response(r, ns)
                yield r
                if taken and r.HasField("message"):  # resumed: grpc.aio has sent it
                    sent.add(r.message.system_properties.receipt_handle)
            answered = True
        finally:
            if taken and not answered:
                rest = [h for h in taken if h not in sent]
                if rest:
                    self._give_back(request.group.name, request.message_queue.topic.name, rest)

    def _give_back(self, group: str, topic: str, handles: list[str]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(
                self.renewer.give_back(group, topic, handles, NACK_INVISIBLE_MS)
            )
        except RuntimeError:  # closed with the loop gone (shutdown): back after their invisible time
            return
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _receive(
        self, request: service.ReceiveMessageRequest, context: grpc.aio.ServicerContext, taken: list[str]
    ) -> list[service.ReceiveMessageResponse]:
        """The responses of one receive; the receipt handles it pops are added to ``taken``
        as soon as the pop returns."""
        group = request.group.name
        if not group:
            raise V2Error(Code.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        resource = request.message_queue.topic
        self._authorize(context, SUB, resource.name, group)
        config = await self._topic(resource.name)
        if not config.readable:
            raise V2Error(Code.FORBIDDEN, f"topic {config.topic_name} is not readable")
        expr = request.filter_expression
        if expr.type == definition.SQL:
            raise V2Error(Code.NOT_IMPLEMENTED, "SQL92 filters are not supported; use a TAG expression")
        filt = TagFilter(expr.expression or "*")
        batch = request.batch_size or MAX_RECEIVE_BATCH
        if not 1 <= batch <= MAX_RECEIVE_BATCH:
            raise V2Error(Code.BAD_REQUEST, f"batch size must be within 1..{MAX_RECEIVE_BATCH}")
        invisible_ms = (
            convert.to_ms(request.invisible_duration)
            if request.HasField("invisible_duration")
            else self.default_invisible_ms
        )
        # A push consumer's receive: hidden for the default time, renewed while it is connected.
        renew = request.auto_renew and not request.HasField("invisible_duration")
        client_id = _metadata(context, "x-mq-client-id")
        if not renew:
            self._check_invisible(invisible_ms, self.invisible_bounds_ms[0])
        wait_ms = (
            convert.to_ms(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else MAX_LONG_POLLING_MS
        )
        remaining = context.time_remaining()
        if remaining is not None:
            wait_ms = min(wait_ms, int(remaining * 1000) - DEADLINE_MARGIN_MS)
        wait_ms = max(0, min(wait_ms, MAX_LONG_POLLING_MS))
        with self._tracer.start_as_current_span("gateway.v2.receive") as span:
            hold = self.held_polls.hold(context.peer()) if wait_ms else contextlib.nullcontext(False)
            with hold as may_hold:
                result = await self.dispatch.pop(
                    group,
                    resource.name,
                    -1,
                    tag_expression=filt.expression,
                    max_count=batch,
                    invisible_ms=invisible_ms,
                    wait_ms=wait_ms if may_hold else 0,
                )
            taken.extend(m.receipt_handle for m in result.messages)
            if wait_ms and not may_hold and not result.messages:
                raise V2Error(
                    Code.TOO_MANY_REQUESTS,
                    f"this client already has {self.limits.max_held_polls_per_client} receives waiting "
                    f"(maxHeldPollsPerClient) or the gateway {self.limits.max_held_polls} (maxHeldPolls); "
                    "retry after a back-off",
                )
            answered = time.perf_counter()
            raws = (
                await self.commitlog.read([(m.phy_offset, m.size) for m in result.messages])
                if result.messages
                else []
            )
            out: list[service.ReceiveMessageResponse] = []
            delivered_bytes = 0
            sends: list[str | None] = []  # the delivered messages' trace contexts
            skipped: list[str] = []
            poisoned: list[str] = []
            for popped, raw in zip(result.messages, raws, strict=True):
                if not raw:
                    skipped.append(popped.receipt_handle)  # cleaned up under the group: nothing to deliver
                    continue
                try:
                    rec = decode_record(raw, check_crc=False)
                    if (rec.queue_id, rec.queue_offset) != (popped.queue_id, popped.queue_offset):
                        # The ConsumeQueue unit points at another record (damaged): never hand
                        # that record out as this slot. It stays in flight and comes back after
                        # its invisible time, and says so again, until the queue is repaired.
                        log.error(
                            "group %s: the ConsumeQueue unit %s:%d:%d points at the record of %d:%d "
                            "(CommitLog offset %d); not delivered",
                            group,
                            resource.name,
                            popped.queue_id,
                            popped.queue_offset,
                            rec.queue_id,
                            rec.queue_offset,
                            popped.phy_offset,
                        )
                        continue
                    if not filt.matches_tags(rec.tags):
                        skipped.append(popped.receipt_handle)  # a tags-code collision: not for this group
                        continue
                    message = convert.consumer_message(
                        rec,
                        namespace=resource.resource_namespace,
                        receipt_handle=popped.receipt_handle,
                        attempt=popped.attempt,
                        invisible_ms=invisible_ms,
                    )
                except Exception:  # one bad record must not fail the batch: it is moved aside
                    log.exception(
                        "group %s: message %s:%d:%d cannot be delivered over this protocol",
                        group,
                        resource.name,
                        popped.queue_id,
                        popped.queue_offset,
                    )
                    poisoned.append(popped.receipt_handle)
                    continue
                if renew:
                    self.renewer.track(
                        client_id, group, resource.name, popped.receipt_handle, popped.visible_at_ms
                    )
                out.append(service.ReceiveMessageResponse(message=message))
                delivered_bytes += len(raw)
                sends.append(message_trace.traceparent_of(rec.properties))
            if skipped:
                await self.dispatch.ack(group, resource.name, skipped)
            for handle in poisoned:  # the dead-letter queue, or quarantine when even that fails
                await self.dispatch.forward_to_dead_letter(group, resource.name, handle)
            span.set_attribute("mqstore.messages", len(out))
            if span.is_recording():
                span.set_attribute(message_trace.SYSTEM, message_trace.SYSTEM_NAME)
                span.set_attribute(message_trace.OPERATION, "receive")
                span.set_attribute(message_trace.DESTINATION, resource.name)
                span.set_attribute(message_trace.CONSUMER_GROUP, group)
                for link in message_trace.links_to(sends):
                    span.add_link(link.context)
            self._get_metrics.record(resource.name, group, len(out), delivered_bytes, answered)
        stamp = service.ReceiveMessageResponse(delivery_timestamp=convert.timestamp_ms(_now_ms()))
        if not out:
            return [
                service.ReceiveMessageResponse(
                    status=convert.status(Code.MESSAGE_NOT_FOUND, "no new message")
                ),
                stamp,
            ]
        return [service.ReceiveMessageResponse(status=convert.status()), *out, stamp]

    @_unary(lambda s: service.AckMessageResponse(status=s))
    async def AckMessage(
        self, request: service.AckMessageRequest, context: grpc.aio.ServicerContext
    ) -> service.AckMessageResponse:
        if not request.group.name:
            raise V2Error(Code.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        if not request.entries:
            raise V2Error(Code.BAD_REQUEST, "no entry to ack")
        self._authorize(context, SUB, request.topic.name, request.group.name)
        async with self.renewer.settling([e.receipt_handle for e in request.entries]) as handles:
            errors = await self.dispatch.ack(request.group.name, request.topic.name, handles)
        entries = [
            service.AckMessageResultEntry(
                message_id=e.message_id,
                receipt_handle=e.receipt_handle,
                status=convert.status()
                if err is None
                else convert.status(convert.code_of_error(err), str(err)),
            )
            for e, err in zip(request.entries, errors, strict=True)
        ]
        top = _overall([e.status for e in entries], "acks")
        return service.AckMessageResponse(status=top, entries=entries)

    @_unary(lambda s: service.ChangeInvisibleDurationResponse(status=s))
    async def ChangeInvisibleDuration(
        self, request: service.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> service.ChangeInvisibleDurationResponse:
        if not request.group.name:
            raise V2Error(Code.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        self._authorize(context, SUB, request.topic.name, request.group.name)
        invisible_ms = convert.to_ms(request.invisible_duration)
        self._check_invisible(invisible_ms, 0)
        # A nack: the client's back-off decides from now on, so renewal stops.
        async with self.renewer.settling([request.receipt_handle]) as (current,):
            handle = await self.dispatch.change_invisible(
                request.group.name, request.topic.name, current, invisible_ms
            )
        return service.ChangeInvisibleDurationResponse(status=convert.status(), receipt_handle=handle)

    # -- transactions -----------------------------------------------------------------------------
    @_unary(lambda s: service.EndTransactionResponse(status=s))
    async def EndTransaction(
        self, request: service.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> service.EndTransactionResponse:
        if not request.transaction_id:
            raise V2Error(Code.INVALID_TRANSACTION_ID, "transaction id is empty")
        if not request.topic.name:
            raise V2Error(Code.ILLEGAL_TOPIC, "the transaction's topic is empty")
        self._authorize(context, PUB, request.topic.name)
        if request.resolution not in (definition.COMMIT, definition.ROLLBACK):
            raise V2Error(Code.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
        try:
            await self.dispatch.end_transaction(
                request.transaction_id,
                request.message_id,
                request.resolution == definition.COMMIT,
                request.topic.name,  # the half message must be of this (authorized) topic
            )
        except InvalidArgumentError as exc:
            raise V2Error(Code.INVALID_TRANSACTION_ID, str(exc)) from None
        return service.EndTransactionResponse(status=convert.status())

    def drain(self) -> int:
        """The gateway is about to stop: complete every Telemetry stream with OK, as a proxy's
        orderly shutdown does, so clients that reopen a completed stream (RocketMQ's Java
        client does a second later) find a gateway that is up; what they held is not released
        early (they keep working on it). Returns how many streams were ended."""
        self._draining = True
        return self.sessions.end_all()

    async def close(self) -> None:
        """Stop the check-back loop (the server has stopped)."""
        task, self._check_task = self._check_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.renewer.close()

    def _ensure_check_loop(self) -> None:
        if self._check_task is None or self._check_task.done():
            self._check_task = asyncio.create_task(self._run_checks())

    async def _run_checks(self) -> None:
        """Every CHECK_POLL_S, while producers are connected: claim the half messages due for a
        check-back of the topics they publish and push each to one of them (spec sheet §3,
        "Transaction check"). Failures are logged and retried on the next round."""
        while True:
            await asyncio.sleep(CHECK_POLL_S)
            topics = self.sessions.producer_topics()
            if not topics:
                continue
            try:
                checks = await self.dispatch.claim_transaction_checks(sorted(topics))
            except Exception as exc:
                log.warning("claiming transaction checks failed: %s", exc)
                continue
            for check in checks:
                self._push_check(check)

    def _push_check(self, check: TransactionCheck) -> None:
        rec = decode_record(check.record, check_crc=False)
        real = rec.properties.get(MessageConst.REAL_TOPIC, rec.topic)
        session = self.sessions.producer_of(real)
        if session is None:
            return  # the producer left meanwhile: the next check goes to another
        message = convert.consumer_message(
            rec, namespace="", receipt_handle="", attempt=check.check_times, invisible_ms=0
        )
        message.topic.name = real
        message.system_properties.message_type = definition.TRANSACTION
        queued = session.offer(
            service.TelemetryCommand(
                status=convert.status(),
                recover_orphaned_transaction_command=service.RecoverOrphanedTransactionCommand(
                    message=message, transaction_id=check.transaction_id
                ),
            )
        )
        if not queued:  # the producer does not read its stream: the check repeats next round
            log.warning("check-back of %s skipped: client %s is not reading", real, session.client_id)

    @_unary(lambda s: service.ForwardMessageToDeadLetterQueueResponse(status=s))
    async def ForwardMessageToDeadLetterQueue(
        self, request: service.ForwardMessageToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> service.ForwardMessageToDeadLetterQueueResponse:
        if not request.group.name:
            raise V2Error(Code.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        self._authorize(context, SUB, request.topic.name, request.group.name)
        async with self.renewer.settling([request.receipt_handle]) as (current,):
            await self.dispatch.forward_to_dead_letter(request.group.name, request.topic.name, current)
        return service.ForwardMessageToDeadLetterQueueResponse(status=convert.status())


def add_to_server(servicer: MessagingServicer, server: grpc.aio.Server) -> list[str]:
    from services.gateway.rocketmq.pb import SERVICE_NAME

    service_grpc.add_MessagingServiceServicer_to_server(servicer, server)
    return [SERVICE_NAME]
