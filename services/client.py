"""The Python client of mqstore's gateway (used by the CLI, the tests and the benchmarks).

* :class:`Producer` sends batches in one Produce call each. Every message gets a UNIQ_KEY before
  the first try, so retrying (UNAVAILABLE, DEADLINE_EXCEEDED) is safe: the commitlog service
  answers a repeated key with the first result. A push back (RESOURCE_EXHAUSTED, SYSTEM_BUSY:
  the gateway cannot keep up and wrote nothing) is retried after the gateway's hint. Beyond
  its de-duplication window delivery is at-least-once. :meth:`Producer.send_batch_async` keeps
  several batches in flight.
* :class:`PullConsumer` consumes a topic as a group: its queues in two (or more) sets, one
  long-polling PullMany in flight per set (per queue Pull against a gateway without PullMany),
  records fetched raw and decoded here, each queue in order (a PullMany reply is read where it
  lies, services.pull_reply); a consumer of one set sends its next pull before it decodes a
  reply, so the gateway reads while it decodes.
  :meth:`PullConsumer.commit` records the offsets after the messages :meth:`PullConsumer.poll`
  returned (at-least-once: commit after processing); a new consumer of the group resumes from
  them. A group whose position retention deleted moves on to the first message kept (logged;
  counted in :attr:`PullConsumer.skipped`).
* :class:`Admin` covers topics, queries, consumer progress and store stats.
* :func:`tune_allocator` keeps freed heap memory in the process, so that decoding pulls of
  megabytes does not fault fresh pages in; a program that consumes at high rates calls it once
  (``mqstore consume`` does). The client never calls it on its own: it is process-wide.

With ``credentials`` (services.credentials.Credentials, an account of the gateway's accounts
file; by default from MQSTORE_ACCESS_KEY and MQSTORE_SECRET_KEY when both are set), every call
is signed; a gateway run with ``--acl-file`` refuses unsigned calls.

TLS: every class takes ``tls=`` (a :class:`services._common.tls.TlsConfig`, e.g.
``TlsConfig.load(ca="ca.pem")``, or ``TlsConfig.from_env()`` for MQSTORE_TLS_*): the gateway's
certificate is verified against its CA, and its certificate, if any, is presented as the client
certificate. None (the default) is plaintext.

Failures raise libstore's StoreError classes (TopicNotFoundError, MessageIllegalError, ...),
mapped from the gRPC status as the services map them.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from libstore import (
    Message,
    MessageConst,
    MessageRecord,
    PutMessageResults,
    ServiceNotAvailableError,
    TopicConfig,
    UniqKeyGenerator,
)
from libstore.record_encoder import STORE_HOST_PLACEHOLDER, RecordEncoder
from libstore.subscription_group import SubscriptionGroupConfig
from libstore.system_topics import TIMER_DELIVER_MS
from services._common import convert, message_trace
from services._common.errors import retry_pushback_ms, store_error_from_rpc
from services._common.message_trace import TRACEPARENT
from services._common.process_tuning import tune_allocator as tune_allocator  # for consuming programs
from services._common.remote import reraise_mapped
from services._common.server import CHANNEL_OPTIONS
from services._common.tls import TlsConfig
from services.credentials import Credentials, SignedGatewayStub, SignedMethod
from services.proto import commitlog_pb, common_pb, dispatch_pb, gateway_grpc, gateway_pb
from services.pull_reply import PulledQueue, pull_many_results

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1:8081"
_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _retry_delay_s(err: grpc.RpcError, attempt: int) -> float | None:
    """Seconds to wait before try ``attempt + 1`` of a call that failed with ``err``, or None
    when it is not to be retried: UNAVAILABLE and DEADLINE_EXCEEDED back off exponentially
    (50 ms doubling, at most 1 s); a push back (RESOURCE_EXHAUSTED with a
    ``grpc-retry-pushback-ms`` hint: nothing was written) waits the hint, plus up to half of it
    at random so refused clients do not all return at once."""
    code = err.code()
    if code in _RETRY_CODES:
        return min(0.05 * 2**attempt, 1.0)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        hint = retry_pushback_ms(err)
        if hint is not None:
            return hint / 1000.0 * (1.0 + random.random() / 2)
    return None


@dataclass
class OutgoingMessage:
    """A message to send; ``queue_id`` -1 lets the gateway choose. ``wait_store`` False sends
    it with WAIT=false (RocketMQ's ``setWaitStoreMsgOK(false)``): it is answered once appended,
    without waiting for the flush (SYNC_FLUSH) or the slaves (SYNC_MASTER); the other messages
    of its batch still wait."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    queue_id: int = -1
    wait_store: bool = True

    def to_message(self, uniq_key: str) -> Message:
        """A libstore Message (for client-side record encoding); born host 0.0.0.0:0 means
        "the caller's address", which the gateway fills in."""
        return Message(
            self.topic,
            self.body,
            self.queue_id,
            properties=self.wire_properties(uniq_key),
            born_host=("0.0.0.0", 0),
        )

    def wire_properties(self, uniq_key: str, traceparent: str | None = None) -> dict[str, str]:
        """The properties the record carries, in the order they are encoded (the order earlier
        clients wrote them in): the user's, ``uniq_key`` as UNIQ_KEY unless the user set one,
        then TAGS and KEYS (keys joined by one space), WAIT=false without ``wait_store``, and
        the send's trace context (``traceparent``, services._common.message_trace) when traced."""
        if (
            not self.properties
            and self.tags is None
            and not self.keys
            and self.wait_store
            and not traceparent
        ):
            return {MessageConst.UNIQ_KEY: uniq_key}  # the common case, without copies
        props = dict(self.properties)
        props.setdefault(MessageConst.UNIQ_KEY, uniq_key)
        if not self.wait_store:
            props[MessageConst.WAIT] = "false"
        if traceparent:
            props[TRACEPARENT] = traceparent
        if self.tags is not None:
            props[MessageConst.TAGS] = self.tags
        if self.keys:
            props[MessageConst.KEYS] = MessageConst.KEY_SEPARATOR.join(self.keys)
        return props

    def to_pb(self, uniq_key: str, traceparent: str | None = None) -> common_pb.Message:
        props = dict(self.properties)
        props.setdefault(MessageConst.UNIQ_KEY, uniq_key)
        if not self.wait_store:
            props[MessageConst.WAIT] = "false"
        if traceparent:
            props[TRACEPARENT] = traceparent
        return common_pb.Message(
            topic=self.topic,
            queue_id=self.queue_id,
            body=self.body,
            tags=self.tags or "",
            keys=list(self.keys),
            properties=props,
            born_timestamp=time.time_ns() // 1_000_000,
        )


class _WireMessage:
    """A message as the record encoder reads it (RecordEncoder.encode_batch takes any object
    with Message's attributes): the four a client sets, the rest at their class defaults
    (born timestamp 0: the encoder's clock; born host 0.0.0.0:0: the gateway fills in the
    caller's address). Cheaper to build than a Message, one per message sent."""

    __slots__ = ("body", "properties", "queue_id", "topic")
    flag = 0
    sys_flag = 0
    born_timestamp = 0
    born_host = ("0.0.0.0", 0)
    reconsume_times = 0
    prepared_transaction_offset = 0

    def __init__(self, topic: str, body: bytes, queue_id: int, properties: dict[str, str]) -> None:
        self.topic = topic
        self.body = body
        self.queue_id = queue_id
        self.properties = properties


class _Connection:
    def __init__(
        self, address: str, tls: TlsConfig | None = None, credentials: Credentials | None = None
    ) -> None:
        credentials = credentials or Credentials.from_env()
        self.address = address
        if tls is None:
            self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        else:
            options = [*CHANNEL_OPTIONS, *tls.channel_options()]
            self.channel = grpc.secure_channel(address, tls.channel_credentials(), options=options)
        self.stub: Any = (
            SignedGatewayStub(self.channel, credentials)
            if credentials is not None
            else gateway_grpc.GatewayStub(self.channel)
        )
        # PullMany with its reply left as bytes (services.pull_reply reads it in place).
        self.pull_many_raw: Any = (
            SignedMethod(self.channel, PULL_MANY_METHOD, None, credentials)
            if credentials is not None
            else self.channel.unary_unary(
                PULL_MANY_METHOD, request_serializer=gateway_pb.PullManyRequest.SerializeToString
            )
        )

    def close(self) -> None:
        self.channel.close()

    def call(
        self,
        method: grpc.UnaryUnaryMultiCallable,
        request: object,
        timeout_s: float,
        retries: int,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> Any:  # the method's response message (grpc's stubs carry no types)
        for attempt in range(retries + 1):
            try:
                return method(request, timeout=timeout_s, metadata=metadata)
            except grpc.RpcError as err:
                delay = _retry_delay_s(err, attempt)
                if delay is None or attempt == retries:
                    reraise_mapped(err)
            time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover


class Producer:
    """Sends messages through the gateway at ``address`` (see module docstring)."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        timeout_s: float = 10.0,
        retries: int = 5,
        encode_records: bool = True,
        tls: TlsConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._conn = _Connection(address, tls, credentials)
        self.timeout_s = timeout_s
        self.retries = retries
        self.encode_records = encode_records
        self._uniq = UniqKeyGenerator()
        # Records are encoded here, in RocketMQ's layout (the gateway only places them); the
        # store checks the size limit, so the local one only guards against absurd bodies.
        self._lock = threading.Lock()
        self._calls: set[grpc.Future] = set()
        self._encoder = RecordEncoder(
            STORE_HOST_PLACEHOLDER, max_message_size=64 * 1024 * 1024, max_topic_length=255
        )

    def _request(
        self, messages: Iterable[OutgoingMessage], traceparent: str | None = None
    ) -> gateway_pb.ProduceRequest:
        if not self.encode_records:
            return gateway_pb.ProduceRequest(
                messages=[m.to_pb(self._uniq.next(), traceparent) for m in messages]
            )
        outgoing = messages if isinstance(messages, list) else list(messages)
        keys = self._uniq.next_many(len(outgoing))
        batch = self._encoder.encode_batch(
            [
                _WireMessage(m.topic, m.body, m.queue_id, m.wire_properties(k, traceparent))
                for m, k in zip(outgoing, keys, strict=True)
            ],
            time.time_ns() // 1_000_000,
            unassigned_queue_ok=True,
        )
        return gateway_pb.ProduceRequest(records=bytes(batch.buf))

    def send(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: Sequence[str] = (),
        queue_id: int = -1,
        delay_level: int = 0,
        deliver_at_ms: int = 0,
        wait_store: bool = True,
    ) -> PutMessageResults:
        """Send one message. ``delay_level`` 1..18 (RocketMQ's levels, 1 s .. 2 h) or
        ``deliver_at_ms`` (ms since the epoch) holds it until then (libstore.scheduled_message);
        the result's queue offset is then the timer queue's. ``wait_store`` False: answered
        once appended, without the flush or slave wait (see OutgoingMessage)."""
        props: dict[str, str] = {}
        if delay_level:
            props[MessageConst.DELAY] = str(delay_level)
        if deliver_at_ms:
            props[TIMER_DELIVER_MS] = str(deliver_at_ms)
        return self.send_batch(
            [OutgoingMessage(topic, body, tags, keys, props, queue_id=queue_id, wait_store=wait_store)]
        )

    def send_batch(self, messages: Sequence[OutgoingMessage]) -> PutMessageResults:
        """One Produce call (retried as the module docstring says); one result per message.
        Traced (an application with an OpenTelemetry SDK): a PRODUCER span ``publish <topic>``
        whose context each message carries (``traceparent``) and the call's metadata too."""
        span = _publish_span(messages)
        if span is None:
            reply = self._conn.call(
                self._conn.stub.Produce, self._request(messages), self.timeout_s, self.retries
            )
            return convert.results_from_pb(reply.results)
        with trace.use_span(span, end_on_exit=True):
            traceparent = message_trace.current_traceparent()
            metadata = ((message_trace.TRACEPARENT, traceparent),) if traceparent else None
            reply = self._conn.call(
                self._conn.stub.Produce,
                self._request(messages, traceparent),
                self.timeout_s,
                self.retries,
                metadata,
            )
            results = convert.results_from_pb(reply.results)
            if len(results) == 1 and results[0].msg_id:
                span.set_attribute(message_trace.MESSAGE_ID, results[0].msg_id)
            return results

    def send_batch_async(
        self, messages: Sequence[OutgoingMessage]
    ) -> concurrent.futures.Future[PutMessageResults]:
        """Start a Produce call; the future gives the results (retries included). Traced as
        :meth:`send_batch`; the span ends when the future is resolved."""
        span = _publish_span(messages)
        traceparent = metadata = None
        if span is not None:
            with trace.use_span(span, end_on_exit=False):
                traceparent = message_trace.current_traceparent()
                metadata = ((message_trace.TRACEPARENT, traceparent),) if traceparent else None
        request = self._request(messages, traceparent)
        out: concurrent.futures.Future[PutMessageResults] = concurrent.futures.Future()
        attempts = [0]

        def start() -> None:
            call = self._conn.stub.Produce.future(request, timeout=self.timeout_s, metadata=metadata)
            with self._lock:
                self._calls.add(call)  # a call future collected while in flight cancels its call
            call.add_done_callback(done)

        def done(call: grpc.Future) -> None:
            with self._lock:
                self._calls.discard(call)
            try:
                reply = call.result()
            except grpc.RpcError as err:
                delay = _retry_delay_s(err, attempts[0] + 1)
                if delay is not None and attempts[0] < self.retries:
                    attempts[0] += 1
                    threading.Timer(delay, start).start()
                    return
                mapped = store_error_from_rpc(err)
                out.set_exception(mapped if mapped is not None else err)
                return
            out.set_result(convert.results_from_pb(reply.results))

        if span is not None:
            out.add_done_callback(lambda fut: _end_publish(span, fut))
        start()
        return out

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_TRACER = trace.get_tracer("mqstore.client")


def _publish_span(messages: Sequence[OutgoingMessage]) -> trace.Span | None:
    """A recording PRODUCER span for a send of ``messages``, or None when nothing records
    (no OpenTelemetry SDK in the application, or not sampled): then nothing is added."""
    if not messages:
        return None
    topic = messages[0].topic
    span = _TRACER.start_span(f"publish {topic}", kind=SpanKind.PRODUCER)
    if not span.is_recording():
        span.end()
        return None
    span.set_attribute(message_trace.SYSTEM, message_trace.SYSTEM_NAME)
    span.set_attribute(message_trace.DESTINATION, topic)
    span.set_attribute(message_trace.OPERATION, "publish")
    if len(messages) > 1:
        span.set_attribute(message_trace.BATCH_COUNT, len(messages))
    else:
        m = messages[0]
        if m.tags:
            span.set_attribute(message_trace.TAG, m.tags)
        if m.keys:
            span.set_attribute(message_trace.KEYS, list(m.keys))
    return span


def _end_publish(span: trace.Span, fut: concurrent.futures.Future[PutMessageResults]) -> None:
    """End an asynchronous send's span with its outcome."""
    exc = fut.exception()
    if exc is not None:
        span.record_exception(exc)
        span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
    else:
        results = fut.result()
        if len(results) == 1 and results[0].msg_id:
            span.set_attribute(message_trace.MESSAGE_ID, results[0].msg_id)
    span.end()


def _trace_receive(topic: str, group: str, records: Sequence[MessageRecord], started_ns: int) -> None:
    """A CONSUMER span ``receive <topic>`` for what one poll returned, from the poll's start,
    linked to each message's send (its ``traceparent``); nothing when nothing records."""
    span = _TRACER.start_span(f"receive {topic}", kind=SpanKind.CONSUMER, start_time=started_ns)
    if span.is_recording():
        span.set_attribute(message_trace.SYSTEM, message_trace.SYSTEM_NAME)
        span.set_attribute(message_trace.DESTINATION, topic)
        span.set_attribute(message_trace.OPERATION, "receive")
        span.set_attribute(message_trace.CONSUMER_GROUP, group)
        span.set_attribute(message_trace.BATCH_COUNT, len(records))
        if len(records) == 1:
            rec = records[0]
            span.set_attribute(message_trace.MESSAGE_ID, rec.msg_id)
            span.set_attribute(message_trace.PARTITION, str(rec.queue_id))
            span.set_attribute(message_trace.QUEUE_OFFSET, rec.queue_offset)
            if rec.tags:
                span.set_attribute(message_trace.TAG, rec.tags)
            if rec.keys:
                span.set_attribute(message_trace.KEYS, rec.keys)
        for link in message_trace.links_to(message_trace.traceparent_of(r.properties) for r in records):
            span.add_link(link.context)
    span.end()


def _queue_sets(queues: Sequence[int]) -> list[tuple[int, ...]]:
    """``queues`` in sets of at most QUEUES_PER_PULL_MANY, at least two sets when there are two
    queues or more: one set's PullMany is served while this process decodes another's."""
    size = max(1, min(QUEUES_PER_PULL_MANY, -(-len(queues) // 2)))
    return [tuple(queues[i : i + size]) for i in range(0, len(queues), size)]


# 8 rather than 4: each PullMany carries twice the records for the same per-call cost in the
# client and in every service it crosses. 200,000 messages over 16 queues, 7 interleaved rounds
# each (2026-11-29), medians, 8 over 4: embedded 1.09x the msgs/s, 0.91x the server's CPU a
# message and 0.81x the client's; split 1.04x, 0.89x the four servers' and 0.77x the client's.
QUEUES_PER_PULL_MANY = 8
PULL_MANY_METHOD = "/mqstore.v1.Gateway/PullMany"


class PullConsumer:
    """Consumes ``topic`` as ``group`` from every read queue (or ``queues``), see module docstring.

    Where it starts: at the group's committed offset of each queue; a group that never committed
    one starts at the queue's min offset, the earliest message kept (RocketMQ's
    CONSUME_FROM_FIRST_OFFSET for a new pull consumer). RocketMQ 5 clients, which pop, start
    at the latest message instead unless their group says ``consume_from="earliest"``
    (``mqstore group create --from``)."""

    def __init__(
        self,
        address: str,
        group: str,
        topic: str,
        *,
        tag_expression: str = "*",
        batch_size: int = 256,
        hold_ms: int = 2000,
        queues: Sequence[int] | None = None,
        timeout_s: float = 10.0,
        tls: TlsConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._conn = _Connection(address, tls, credentials)
        self.group = group
        self.topic = topic
        self.tag_expression = tag_expression
        self.batch_size = batch_size
        self.hold_ms = hold_ms
        self.timeout_s = timeout_s
        if queues is None:
            route = self._conn.call(
                self._conn.stub.GetRoute, gateway_pb.GetRouteRequest(topic=topic), timeout_s, 3
            )
            queues = range(route.topic.read_queue_nums)
        self.queues = list(queues)
        self._next: dict[int, int] = dict.fromkeys(self.queues, -1)  # -1: the group's committed offset
        self._consumed: dict[int, int] = {}  # offsets to commit: after what poll() returned
        self._committed: dict[int, int] = {}
        # In flight: a PullMany per set of queues (keyed by the set), or a Pull per queue
        # (keyed by its id) against a gateway that has no PullMany.
        self._inflight: dict[int | tuple[int, ...], grpc.Future] = {}
        self._done: queue.Queue[int | tuple[int, ...]] = queue.Queue()  # keys whose call completed
        self._sets = _queue_sets(self.queues)
        self._pull_many = True  # until the gateway answers UNIMPLEMENTED (one from before it)
        self._turn = 0  # rotates each set's order, so no queue always comes last under max_bytes
        # Per queue: messages passed over because retention deleted them before they were
        # consumed (the gateway counts them in each pull's reply).
        self.skipped: dict[int, int] = dict.fromkeys(self.queues, 0)

    def _pull(self, queue_id: int, wait_ms: int) -> grpc.Future:
        request = gateway_pb.PullRequest(
            group=self.group,
            topic=self.topic,
            queue_id=queue_id,
            offset=self._next[queue_id],
            max_count=self.batch_size,
            tag_expression=self.tag_expression,
            wait_ms=wait_ms,
            raw=True,
        )
        return self._conn.stub.Pull.future(request, timeout=self.timeout_s + wait_ms / 1000.0)

    def _pull_set(self, queues: tuple[int, ...], wait_ms: int) -> grpc.Future:
        turn = self._turn % len(queues)
        self._turn += 1
        request = gateway_pb.PullManyRequest(
            group=self.group,
            topic=self.topic,
            queues=[
                gateway_pb.QueuePull(queue_id=q, offset=self._next[q], max_count=self.batch_size)
                for q in queues[turn:] + queues[:turn]
            ],
            tag_expression=self.tag_expression,
            wait_ms=wait_ms,
        )
        return self._conn.pull_many_raw.future(request, timeout=self.timeout_s + wait_ms / 1000.0)

    def _start(self, key: int | tuple[int, ...]) -> None:
        """Send the pull of ``key`` (a set's PullMany, or one queue's Pull) from where its
        queues stand, long-polling; its completion is queued on ``_done``."""
        fut = self._pull_set(key, self.hold_ms) if isinstance(key, tuple) else self._pull(key, self.hold_ms)
        self._inflight[key] = fut
        fut.add_done_callback(lambda _f: self._done.put(key))

    def poll(self, timeout_ms: int = 1000) -> list[MessageRecord]:
        """Messages from whichever queues have some (each queue in order), waiting up to
        ``timeout_ms`` when none has. Pulls that are still held stay in flight for the next
        poll. A reply with nothing in it (a hold that ran out while the caller was away, or
        units the tag filter passed over) does not end the wait: its set is pulled again
        (with ``hold_ms`` 0, one round of pulls is all a poll sends)."""
        started_ns = time.time_ns()
        deadline = time.monotonic() + timeout_ms / 1000.0
        out: list[MessageRecord] = []
        failed: set[int | tuple[int, ...]] = set()  # pulled again on the next poll, not this one
        while True:
            keys: Sequence[int | tuple[int, ...]] = self._sets if self._pull_many else self.queues
            for key in keys:
                if key not in self._inflight and key not in failed:
                    self._start(key)
            if not self._inflight:
                break
            try:
                ready = [self._done.get(timeout=max(0.0, deadline - time.monotonic()))]
            except queue.Empty:
                break
            while True:  # and whatever else completed meanwhile
                try:
                    ready.append(self._done.get_nowait())
                except queue.Empty:
                    break
            for key in ready:
                fut = self._inflight.pop(key, None)
                if fut is not None:
                    records = self._take(key, fut)
                    if records is None:
                        failed.add(key)
                    else:
                        out.extend(records)
            if out or not self.hold_ms or time.monotonic() >= deadline:
                break  # (without a hold, one round: pulling again at once would only spin)
        if out:
            _trace_receive(self.topic, self.group, out, started_ns)
        return out

    def _take(self, key: int | tuple[int, ...], fut: grpc.Future) -> list[MessageRecord] | None:
        """The records of the completed pull ``key`` (its queues' positions move), or None when
        it failed with a status worth retrying. When no other pull is in flight, the next pull
        of ``key`` goes out before the records are decoded, so the gateway reads while this
        process decodes (with other sets in flight, one is served meanwhile already, and a
        pull more would only contend for this process's GIL)."""
        try:
            reply = fut.result()
        except grpc.RpcError as err:
            if isinstance(key, tuple) and err.code() is grpc.StatusCode.UNIMPLEMENTED:
                self._pull_many = False  # a gateway from before PullMany: a Pull per queue from now on
                return []
            if err.code() in _RETRY_CODES:
                return None
            reraise_mapped(err)
        if isinstance(key, tuple):  # a PullMany's reply, as bytes
            results = [r for r in pull_many_results(reply) if r.queue_id in key]
        else:
            results = [PulledQueue.of(reply, key)]
        for result in results:
            self._advance(result)
        if not self._inflight:
            self._start(key)
        out: list[MessageRecord] = []
        for result in results:
            out.extend(result.records())
        return out

    def _advance(self, reply: PulledQueue) -> None:
        """Take one queue's pull result: move its position, count what retention skipped."""
        queue_id = reply.queue_id
        self._next[queue_id] = reply.next_offset
        self._note_skipped(queue_id, reply)
        if reply.has_records:
            self._consumed[queue_id] = reply.next_offset
        elif reply.next_offset >= 0 and self._consumed.get(queue_id, -1) < reply.next_offset:
            # filtered-out or skipped units still move the committed position
            self._consumed[queue_id] = reply.next_offset

    def _note_skipped(self, queue_id: int, reply: Any) -> None:
        """Count (and log) the messages a pull passed over because retention deleted them."""
        if reply.skipped:
            self.skipped[queue_id] = self.skipped.get(queue_id, 0) + reply.skipped
            log.warning(
                "%s: queue %d of %s: %d message(s) were deleted (retention) before they were "
                "consumed; consuming on from offset %d",
                self.group,
                queue_id,
                self.topic,
                reply.skipped,
                reply.next_offset,
            )

    def fetch_raw(self, queue_id: int, offset: int, max_count: int) -> tuple[list[bytes], int]:
        """One pull from ``offset`` without waiting: up to ``max_count`` CommitLog records (raw
        bytes, in queue order) and the offset to pull next (past filtered-out units; the queue's
        min offset when ``offset`` was already cleaned away; messages passed over because they
        were deleted are added to :attr:`skipped`). Does not move :meth:`poll`'s position.
        Raises TopicNotFoundError and the other mapped store errors."""
        reply: Any = self._conn.call(
            self._conn.stub.Pull, self._raw_request(queue_id, offset, max_count), self.timeout_s, 3
        )
        self._note_skipped(queue_id, reply)
        return list(reply.records), int(reply.next_offset)

    def prefetch_raw(
        self, queue_id: int, offset: int, max_count: int
    ) -> Callable[[], tuple[list[bytes], int]]:
        """:meth:`fetch_raw` started now and answered later: returns a function that gives its
        result (so a reader decodes one pull while the store serves the next). A failed
        attempt is made again, with :meth:`fetch_raw`'s retries and errors, when asked for."""
        future = self._conn.stub.Pull.future(
            self._raw_request(queue_id, offset, max_count), timeout=self.timeout_s
        )

        def result() -> tuple[list[bytes], int]:
            try:
                reply = future.result()
            except grpc.RpcError:
                return self.fetch_raw(queue_id, offset, max_count)
            self._note_skipped(queue_id, reply)
            return list(reply.records), int(reply.next_offset)

        return result

    def _raw_request(self, queue_id: int, offset: int, max_count: int) -> object:
        return gateway_pb.PullRequest(
            group=self.group,
            topic=self.topic,
            queue_id=queue_id,
            offset=offset,
            max_count=max_count,
            tag_expression=self.tag_expression,
            raw=True,
        )

    def commit(self) -> None:
        """Commit, per queue, the offset after the last message returned by :meth:`poll`."""
        for qid, offset in list(self._consumed.items()):
            if self._committed.get(qid) == offset:
                continue
            request = dispatch_pb.CommitOffsetRequest(
                group=self.group, topic=self.topic, queue_id=qid, offset=offset
            )
            self._conn.call(self._conn.stub.CommitOffset, request, self.timeout_s, 3)
            self._committed[qid] = offset

    def close(self) -> None:
        for fut in self._inflight.values():
            fut.cancel()
        self._inflight.clear()
        self._conn.close()

    def __enter__(self) -> PullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Admin:
    """Topics, queries, progress and stats through the gateway."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        timeout_s: float = 10.0,
        tls: TlsConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._conn = _Connection(address, tls, credentials)
        self.timeout_s = timeout_s

    def _call(self, method: grpc.UnaryUnaryMultiCallable, request: object) -> Any:
        return self._conn.call(method, request, self.timeout_s, 3)

    def create_topic(
        self,
        topic: str,
        queues: int = 0,
        *,
        perm: int = 6,
        message_type: str = "NORMAL",
        retention_hours: float = 0.0,
        durability: str = "persistent",
    ) -> TopicConfig:
        """Create or update ``topic`` (``queues`` 0: the store's default count;
        ``retention_hours`` 0: the store's fileReservedTime; ``durability`` persistent or
        transient, libstore.durability). Raises InvalidArgumentError."""
        pb = common_pb.TopicConfig(
            topic=topic,
            read_queue_nums=queues,
            write_queue_nums=queues,
            perm=perm,
            message_type=message_type,
            retention_hours=retention_hours,
            durability=durability,
        )
        return convert.topic_from_pb(
            self._call(self._conn.stub.CreateTopic, gateway_pb.CreateTopicRequest(config=pb))
        )

    def upsert_group(
        self,
        group: str,
        *,
        retry_max_times: int = 16,
        orderly: bool = False,
        consume_enable: bool = True,
        consume_from: str = "latest",
    ) -> SubscriptionGroupConfig:
        """Create or update a consumer group (pop model: redeliveries before the DLQ, FIFO, and
        where it starts in a queue it has no offset for: "latest" or "earliest")."""
        from services.dispatch.convert import group_from_pb, group_to_pb

        request = group_to_pb(
            SubscriptionGroupConfig(
                group,
                consume_enable=consume_enable,
                retry_max_times=retry_max_times,
                consume_message_orderly=orderly,
                consume_from=consume_from,
            )
        )
        return group_from_pb(self._call(self._conn.stub.UpsertSubscriptionGroup, request))

    def delete_topic(self, topic: str) -> bool:
        """Delete ``topic``: its stored messages are expired at once; False when it did not
        exist."""
        reply = self._call(self._conn.stub.DeleteTopic, commitlog_pb.DeleteTopicRequest(topic=topic))
        return bool(reply.deleted)

    def list_topics(self) -> list[TopicConfig]:
        reply = self._call(self._conn.stub.ListTopics, commitlog_pb.ListTopicsRequest())
        return [convert.topic_from_pb(t) for t in reply.topics]

    def query_by_key(
        self, topic: str, key: str, *, max_count: int = 32, begin_ms: int = 0, end_ms: int = 0
    ) -> list[gateway_pb.MessageView]:
        request = gateway_pb.QueryMessageRequest(
            topic=topic, key=key, max_count=max_count, begin_ms=begin_ms, end_ms=end_ms
        )
        return list(self._call(self._conn.stub.QueryMessage, request).messages)

    def query_by_id(self, msg_id: str) -> gateway_pb.MessageView:
        reply = self._call(self._conn.stub.QueryMessage, gateway_pb.QueryMessageRequest(msg_id=msg_id))
        return reply.messages[0]

    def query_by_time(self, topic: str, timestamp_ms: int) -> list[gateway_pb.MessageView]:
        request = gateway_pb.QueryMessageRequest(topic=topic, timestamp_ms=timestamp_ms)
        return list(self._call(self._conn.stub.QueryMessage, request).messages)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Set ``group``'s offset in a queue (a reset when moving back). OffsetOutOfRangeError
        past the queue's max."""
        request = dispatch_pb.CommitOffsetRequest(group=group, topic=topic, queue_id=queue_id, offset=offset)
        self._call(self._conn.stub.CommitOffset, request)

    def consumer_progress(self, group: str, topic: str) -> dispatch_pb.ConsumerProgress:
        request = dispatch_pb.GetConsumerProgressRequest(group=group, topic=topic)
        return self._call(self._conn.stub.GetConsumerProgress, request)

    def queue_offsets(self, topic: str, timestamp_ms: int = 0) -> list[gateway_pb.QueueOffsets]:
        """Each queue's [min, max) offsets; with ``timestamp_ms`` (ms since the epoch) also the
        first offset stored at or after it (``offset_at_time``, the max when none is).
        Raises TopicNotFoundError."""
        request = gateway_pb.GetQueueOffsetsRequest(topic=topic, timestamp_ms=timestamp_ms)
        return list(self._call(self._conn.stub.GetQueueOffsets, request).queues)

    def store_stats(self) -> gateway_pb.StoreStats:
        return self._call(self._conn.stub.GetStoreStats, gateway_pb.GetStoreStatsRequest())

    def wait_until_serving(self, timeout_s: float = 60.0) -> None:
        """Block until the gateway's health check says SERVING (ServiceNotAvailableError after
        ``timeout_s``)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._conn.channel)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise ServiceNotAvailableError(f"{self._conn.address} is not serving after {timeout_s:.0f} s")
            time.sleep(0.1)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
