"""GatewayServicer: mqstore.v1.Gateway, the client-facing API, over three ports.

* Produce: messages without a queue (-1) are placed round robin by the commitlog; messages
  without UNIQ_KEY get one, so a retried append is de-duplicated by the commitlog service.
* Pull: the committed offset when the request says -1 (else the queue's min); ConsumeQueue units
  from dispatch (tags-code filter, long polling), records from the commitlog, the exact tag
  checked here (libstore.get_message's two phases).
* QueryMessage by key (index, keys confirmed on the records), by offset message id, or by time
  (one message per queue, the first stored at or after it).
* Admin: topics, consumer progress, store stats, route.

Access control (``acl`` given): every call was authenticated by
services.gateway.caller.OwnApiAuth; each method then requires what it touches
(services.gateway.acl): PUB on every topic it produces to, SUB on the topic and the group it
consumes as or reads progress of, an admin account for CreateTopic, UpsertSubscriptionGroup and
GetStoreStats; ListTopics lists what the account may use. Whatever the ACL, producers never
write system topics, the store's own properties or its SYSFLAG bits (libstore.producer_input).

Bad input raises libstore errors, mapped to gRPC codes by the server's error mapping. Bounds
(services.gateway.limits): messages and bytes per produce, long polls held per client and in
total (RESOURCE_EXHAUSTED past them when nothing is there to answer with), one record per by-id
query. A produce the gateway cannot keep up with is refused before anything is written
(RESOURCE_EXHAUSTED, SYSTEM_BUSY, with a retry hint: services.gateway.admission).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
import time
from collections.abc import Sequence

import grpc
from opentelemetry.trace import Span

from libstore import (
    InvalidArgumentError,
    MessageConst,
    MessageNotFoundError,
    QueueIdOutOfRangeError,
    StoreError,
    TopicConfig,
    TopicNotFoundError,
    UniqKeyGenerator,
    decode_message_id,
    decode_record,
)
from libstore.consume_queue import BoundaryType
from libstore.errors import AuthenticationError, PermissionDeniedError, TooManyRequestsError
from libstore.get_message import GetMessageResult, UnitSelection, fetch_messages
from libstore.message_filter import TagFilter
from libstore.producer_input import check_producer_properties, check_producer_topic, producer_sys_flag
from libstore.record_codec import (
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    RECORD_OVERHEAD_V1_IPV4,
    decode_records,
    record_topics,
)
from libstore.record_framing import value_starts
from libstore.results import GetMessageStatus
from libstore.system_topics import is_system_topic
from services._common import convert, message_trace, wire
from services._common.telemetry import tracer
from services.dispatch.convert import PULL_STATUS_TO_PB, group_from_pb, group_to_pb, progress_to_pb
from services.gateway.acl import PUB, SUB, AccessControl, Account
from services.gateway.admission import ProduceAdmission
from services.gateway.caller import current_account
from services.gateway.limits import GatewayLimits, HeldPolls
from services.gateway.metrics import get_metrics
from services.gateway.topic_cache import TopicCache
from services.ports import CommitLogPort, DispatchPort, Entries, IndexPort
from services.proto import commitlog_pb, common_pb, dispatch_pb, gateway_grpc, gateway_pb

SERVICE_NAME = gateway_pb.DESCRIPTOR.services_by_name["Gateway"].full_name


class GatewayServicer(gateway_grpc.GatewayServicer):
    """The gateway over its ports. ``endpoints`` are the addresses clients should use; with
    ``acl``, calls are authorized per method (module doc)."""

    def __init__(
        self,
        commitlog: CommitLogPort,
        dispatch: DispatchPort,
        index: IndexPort,
        *,
        endpoints: list[str],
        max_pull_batch: int = 1024,
        max_hold_ms: int = 30_000,
        acl: AccessControl | None = None,
        limits: GatewayLimits | None = None,
    ) -> None:
        self.acl = acl
        self.commitlog = commitlog
        self.dispatch = dispatch
        self.index = index
        self.endpoints = endpoints
        self.max_pull_batch = max_pull_batch
        self.max_hold_ms = max_hold_ms
        self.limits = limits = limits or GatewayLimits()
        self.held_polls = HeldPolls(limits.max_held_polls, limits.max_held_polls_per_client)
        self.admission = ProduceAdmission.of(limits)
        self.topics = TopicCache(commitlog)
        self._uniq = UniqKeyGenerator()
        self._tracer = tracer("mqstore.gateway")
        self._get_metrics = get_metrics()

    # -- access control ---------------------------------------------------------------------------
    def _caller(self) -> Account | None:
        """The authenticated account (None with the ACL off). Raises AuthenticationError when
        the ACL is on and the call was not authenticated (the OwnApiAuth wrapper is missing)."""
        if self.acl is None:
            return None
        account = current_account()
        if account is None:
            raise AuthenticationError("calls must be signed")
        return account

    def _allow(self, perm: int, topic: str = "", group: str = "") -> None:
        """Require ``perm`` (PUB, SUB, PUB|SUB for either) on ``topic`` and consumption as
        ``group``. Raises PermissionDeniedError."""
        account = self._caller()
        if account is not None:
            AccessControl.authorize(account, perm, topic, group)

    def _admin(self, operation: str) -> None:
        """Require an admin account. Raises PermissionDeniedError."""
        account = self._caller()
        if account is not None:
            AccessControl.require_admin(account, operation)

    # -- produce ----------------------------------------------------------------------------------
    async def Produce(self, request: gateway_pb.ProduceRequest, context: grpc.aio.ServicerContext) -> bytes:
        """A ProduceResponse, encoded here (convert.encode_results_reply)."""
        if request.records:
            if request.messages:
                raise InvalidArgumentError("send messages or records, not both")
            size = len(request.records)
            problem = self.limits.request_problem(0, size)
            if problem:
                raise InvalidArgumentError(problem)
            with self.admission.admit(size):
                return await self._produce_records(request.records, context.peer())
        messages = request.messages
        n = len(messages)
        size = request.ByteSize()
        problem = self.limits.request_problem(n, size)
        if problem:
            raise InvalidArgumentError(problem)
        for topic in {m.topic for m in messages}:
            check_producer_topic(topic)
            self._allow(PUB, topic)
        with self.admission.admit(size), self._tracer.start_as_current_span("gateway.produce") as span:
            span.set_attribute("mqstore.messages", n)
            if span.is_recording():
                _trace_publish(span, messages[0].topic if n else "", n)
            self._prepare(messages, context.peer())
            results = await self.commitlog.append(messages)
            span.set_attribute("mqstore.status", results.status.name)
            return convert.encode_results_reply(results)

    async def _produce_records(self, raw: bytes, peer: str) -> bytes:
        """Client-encoded records go to the commitlog as they are, with the caller's address for
        records that left BORNHOST empty; it validates them and places those with QUEUEID -1.
        With the ACL on, the topics are read from the record headers here, to authorize the
        batch first (on a worker thread for a large batch, as the commitlog validates it); the
        commitlog applies the producer rules (libstore.producer_input) to records itself."""
        if self.acl is not None:
            cap = self.limits.max_messages_per_request
            if len(raw) > self.limits.offload_validation_bytes:
                topics = await asyncio.to_thread(record_topics, raw, cap)
            else:
                topics = record_topics(raw, cap)
            for topic in topics:
                check_producer_topic(topic)
                self._allow(PUB, topic)
        with self._tracer.start_as_current_span("gateway.produce") as span:
            span.set_attribute("mqstore.bytes", len(raw))
            if span.is_recording():
                _trace_publish(span, "", 0)
            results = await self.commitlog.append_records(raw, convert.peer_text(peer))
            span.set_attribute("mqstore.messages", len(results))
            span.set_attribute("mqstore.status", results.status.name)
            return convert.encode_results_reply(results)

    def _prepare(self, messages: Sequence[common_pb.Message], peer: str) -> None:
        """Complete the protobuf messages in place, for the commitlog to encode as they are:
        TAGS/KEYS fields into properties, a UNIQ_KEY where missing, the caller's address as born
        host. A queue id of -1 stays: the commitlog places it round robin. Refuses (before
        anything is changed) the store's own properties; masks SYSFLAG to the producer's bits."""
        for m in messages:
            check_producer_properties(m.properties)
        peer_host = ""
        uniq = self._uniq
        for m in messages:
            m.sys_flag = producer_sys_flag(m.sys_flag)
            props = m.properties
            if m.tags:
                props[MessageConst.TAGS] = m.tags
            if m.keys:
                props[MessageConst.KEYS] = MessageConst.KEY_SEPARATOR.join(m.keys)
            if MessageConst.UNIQ_KEY not in props:
                props[MessageConst.UNIQ_KEY] = uniq.next()
            if not m.born_host:
                peer_host = peer_host or convert.peer_text(peer)
                m.born_host = peer_host

    # -- pull -------------------------------------------------------------------------------------
    async def _readable(self, topic: str, *queue_ids: int) -> TopicConfig:
        """``topic``'s config, once ``queue_ids`` are among its read queues and it is readable."""
        config = await self.topics.get(topic)
        if config is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        for queue_id in queue_ids:
            if not 0 <= queue_id < config.read_queue_nums:
                raise QueueIdOutOfRangeError(
                    f"queue id {queue_id} out of range: topic {topic!r} has "
                    f"{config.read_queue_nums} read queues"
                )
        if not config.readable:
            raise InvalidArgumentError(f"topic {topic!r} is not readable (perm {config.perm})")
        return config

    async def Pull(
        self, request: gateway_pb.PullRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb.PullResponse | bytes:
        if not request.group:
            raise InvalidArgumentError("group must be non-empty")
        self._check_pull(request.queue_id, request.offset, request.max_count)
        if request.wait_ms < 0:
            raise InvalidArgumentError("wait_ms must be >= 0")
        self._allow(SUB, request.topic, request.group)
        await self._readable(request.topic, request.queue_id)
        with self._tracer.start_as_current_span("gateway.pull") as span:
            offset = request.offset
            if offset < 0:
                offset = await self._start_offset(request.group, request.topic, request.queue_id)
            filt = TagFilter(request.tag_expression)
            wait_ms = min(request.wait_ms, self.max_hold_ms)
            hold = self.held_polls.hold(context.peer()) if wait_ms else contextlib.nullcontext(False)
            with hold as may_hold:
                entries = await self.dispatch.get_entries(
                    request.topic,
                    request.queue_id,
                    offset,
                    request.max_count,
                    tag_codes=sorted(filt.codes) if filt.codes else (),
                    wait_ms=wait_ms if may_hold else 0,
                )
            if wait_ms and not may_hold and not entries.phy_offsets:
                raise self._too_many_held()
            answered = time.perf_counter()
            selection = _selection(entries)
            if request.raw and selection.sizes and filt.accepts_all and not span.is_recording():
                encoded = await self._encoded_results([selection], selection.ranges(), [(0, offset)], filt)
                if encoded is not None:
                    (fields,), delivered_bytes = encoded
                    span.set_attribute("mqstore.messages", len(selection.sizes))
                    self._get_metrics.record(
                        request.topic, request.group, len(selection.sizes), delivered_bytes, answered
                    )
                    return b"".join(fields)
            raws = await self.commitlog.read(selection.ranges()) if selection.sizes else []
            result = fetch_messages(selection, raws, filt)
            span.set_attribute("mqstore.messages", len(result.records))
            if span.is_recording():
                _trace_delivery(span, request.topic, request.group, result.records)
            reply = _pull_response(gateway_pb.PullResponse(), result, offset, raw=request.raw)
            self._get_metrics.record(
                request.topic, request.group, len(result.records), result.total_bytes, answered
            )
            return reply

    async def PullMany(
        self, request: gateway_pb.PullManyRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb.PullManyResponse | bytes:
        if not request.group:
            raise InvalidArgumentError("group must be non-empty")
        queues = request.queues
        if not 1 <= len(queues) <= MAX_QUEUES_PER_PULL:
            raise InvalidArgumentError(f"a PullMany names 1..{MAX_QUEUES_PER_PULL} queues, got {len(queues)}")
        if len({q.queue_id for q in queues}) != len(queues):
            raise InvalidArgumentError("queue ids must be distinct")
        for q in queues:
            self._check_pull(q.queue_id, q.offset, q.max_count)
        if request.wait_ms < 0 or request.max_bytes < 0:
            raise InvalidArgumentError("wait_ms and max_bytes must be >= 0")
        topic = request.topic
        self._allow(SUB, topic, request.group)
        await self._readable(topic, *(q.queue_id for q in queues))
        with self._tracer.start_as_current_span("gateway.pull_many") as span:
            queries = [
                (
                    q.queue_id,
                    q.offset if q.offset >= 0 else await self._start_offset(request.group, topic, q.queue_id),
                    q.max_count,
                )
                for q in queues
            ]
            filt = TagFilter(request.tag_expression)
            wait_ms = min(request.wait_ms, self.max_hold_ms)
            hold = self.held_polls.hold(context.peer()) if wait_ms else contextlib.nullcontext(False)
            with hold as may_hold:
                answers = await self.dispatch.get_entries_many(
                    topic,
                    queries,
                    total_bytes=min(request.max_bytes or PULL_MANY_MAX_BYTES, PULL_MANY_MAX_BYTES),
                    tag_codes=sorted(filt.codes) if filt.codes else (),
                    wait_ms=wait_ms if may_hold else 0,
                )
            if wait_ms and not may_hold and not any(e.phy_offsets for e in answers):
                raise self._too_many_held()
            answered = time.perf_counter()
            selections = [_selection(e) for e in answers]
            # One read for every queue's records (a remote commitlog plans it into bounded calls).
            ranges = list(itertools.chain.from_iterable(sel.ranges() for sel in selections))
            if ranges and filt.accepts_all and not span.is_recording():
                pulls = [(q[0], q[1]) for q in queries]
                encoded = await self._encoded_results(selections, ranges, pulls, filt)
                if encoded is not None:
                    results, delivered_bytes = encoded
                    span.set_attribute("mqstore.messages", len(ranges))
                    self._get_metrics.record(topic, request.group, len(ranges), delivered_bytes, answered)
                    return b"".join(
                        itertools.chain.from_iterable(
                            wire.length_delimited(wire.PULL_MANY_RESULTS_TAG, fields) for fields in results
                        )
                    )
            raws = await self.commitlog.read(ranges) if ranges else []
            reply = gateway_pb.PullManyResponse()
            start = 0
            delivered = delivered_bytes = 0
            delivered_raws: list[bytes] | None = [] if span.is_recording() else None
            for (queue_id, offset, _), sel in zip(queries, selections, strict=False):
                end = start + len(sel.sizes)
                result = fetch_messages(sel, raws[start:end], filt)
                start = end
                _pull_response(reply.results.add(), result, offset, raw=True, queue_id=queue_id)
                delivered += len(result.records)
                delivered_bytes += result.total_bytes
                if delivered_raws is not None:
                    delivered_raws += result.records
            span.set_attribute("mqstore.messages", delivered)
            if delivered_raws is not None:  # one set of links for the whole call
                _trace_delivery(span, topic, request.group, delivered_raws)
            self._get_metrics.record(topic, request.group, delivered, delivered_bytes, answered)
            return reply

    async def _encoded_results(
        self,
        selections: Sequence[UnitSelection],
        ranges: list[tuple[int, int]],
        pulls: Sequence[tuple[int, int]],
        filt: TagFilter,
    ) -> tuple[list[list[bytes | memoryview]], int] | None:
        """The PullResponses answering ``selections`` (one per queue, from the (queue id, start
        offset) ``pulls``; ``ranges``: their units' records, in order), each encoded here in
        pieces to join (header fields, then records), and the record bytes they carry: the
        records pass from the commitlog's reply into these without being decoded
        (services._common.wire). None when a record is missing (retention, a transient message
        gone): the caller then reads them one by one."""
        framed = await self.commitlog.read_framed(ranges, wire.PULL_RECORDS_TAG)
        found = value_starts(framed, wire.PULL_RECORDS_TAG, len(ranges))
        if found is None:
            return None
        starts, delivered_bytes = found
        records = memoryview(framed)
        results: list[list[bytes | memoryview]] = []
        first = 0
        for (queue_id, offset), sel in zip(pulls, selections, strict=False):
            count = len(sel.sizes)
            result = (
                GetMessageResult(
                    GetMessageStatus.FOUND,
                    sel.next_offset,
                    sel.min_offset,
                    sel.max_offset,
                    queue_offsets=sel.queue_offsets,
                )
                if count
                else fetch_messages(sel, [], filt)
            )
            header = _pull_response(gateway_pb.PullResponse(), result, offset, raw=True, queue_id=queue_id)
            fields: list[bytes | memoryview] = [header.SerializeToString()]
            if count:
                fields.append(records[starts[first] : starts[first + count]])
            results.append(fields)
            first += count
        return results, delivered_bytes

    def _check_pull(self, queue_id: int, offset: int, max_count: int) -> None:
        """One queue's part of a Pull or PullMany; InvalidArgumentError when out of bounds."""
        if not 1 <= max_count <= self.max_pull_batch:
            raise InvalidArgumentError(
                f"queue {queue_id}: max_count must be within 1..{self.max_pull_batch}, got {max_count}"
            )
        if offset < -1:
            raise InvalidArgumentError(
                f"queue {queue_id}: offset must be >= 0 (or -1: the committed offset), got {offset}"
            )

    def _too_many_held(self) -> TooManyRequestsError:
        """A pull with a wait that may not be held and has nothing to answer at once."""
        return TooManyRequestsError(
            f"this client already has {self.limits.max_held_polls_per_client} pulls waiting "
            f"(maxHeldPollsPerClient) or the gateway {self.limits.max_held_polls} "
            "(maxHeldPolls); retry after a back-off"
        )

    async def _start_offset(self, group: str, topic: str, queue_id: int) -> int:
        committed = await self.dispatch.query_offset(group, topic, queue_id)
        if committed >= 0:
            return committed
        infos = await self.dispatch.queue_info(topic, queue_id)
        return infos[0].min_offset if infos else 0

    async def CommitOffset(
        self, request: dispatch_pb.CommitOffsetRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.CommitOffsetResponse:
        if not request.group:
            raise InvalidArgumentError("group must be non-empty")
        self._allow(SUB, request.topic, request.group)
        await self._readable(request.topic, request.queue_id)
        await self.dispatch.commit_offset(request.group, request.topic, request.queue_id, request.offset)
        return dispatch_pb.CommitOffsetResponse()

    async def QueryOffset(
        self, request: dispatch_pb.QueryOffsetRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.QueryOffsetResponse:
        if not request.group:
            raise InvalidArgumentError("group must be non-empty")
        self._allow(SUB, request.topic, request.group)
        await self._readable(request.topic, request.queue_id)
        offset = await self.dispatch.query_offset(request.group, request.topic, request.queue_id)
        return dispatch_pb.QueryOffsetResponse(offset=offset)

    # -- query ------------------------------------------------------------------------------------
    async def QueryMessage(
        self, request: gateway_pb.QueryMessageRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb.QueryMessageResponse:
        which = request.WhichOneof("by")
        max_count = request.max_count or 32
        if max_count < 0:
            raise InvalidArgumentError("max_count must be >= 0")
        with self._tracer.start_as_current_span("gateway.query") as span:
            span.set_attribute("mqstore.query", which or "")
            if which == "msg_id":
                try:
                    records = await self._by_msg_id(request.msg_id)
                    for record in records:  # the topic is known once the record is read
                        self._allow(SUB, record.topic)
                except PermissionDeniedError:  # one answer for "none there" and "not yours"
                    raise MessageNotFoundError(f"no message with id {request.msg_id}") from None
            elif which == "key":
                self._allow(SUB, request.topic)
                records = await self._by_key(request, max_count)
            elif which == "timestamp_ms":
                self._allow(SUB, request.topic)
                records = await self._by_time(request.topic, request.timestamp_ms)
            else:
                raise InvalidArgumentError("query by key, msg_id or timestamp_ms")
            return gateway_pb.QueryMessageResponse(messages=[convert.record_to_view(r) for r in records])

    async def _by_msg_id(self, msg_id: str) -> list:
        """The one record the offset message id points at. Its header (TOTALSIZE, MAGICCODE) is
        read first and must describe a message record of at most the largest record size, so
        a forged id never copies more than one record. Raises MessageNotFoundError, with one
        message whatever the reason (with the ACL on, a caller must not learn where records
        start or, from its refusal, what topic one belongs to)."""
        parts = decode_message_id(msg_id)
        (head,) = await self.commitlog.read([(parts.phy_offset, _HEADER.size)])
        if not head or len(head) < _HEADER.size:
            raise MessageNotFoundError(f"no message with id {msg_id}")
        size, magic = _HEADER.unpack_from(head, 0)
        if magic not in _MESSAGE_MAGICS or not RECORD_OVERHEAD_V1_IPV4 <= size <= self.limits.max_record_size:
            raise MessageNotFoundError(f"no message with id {msg_id}")
        (raw,) = await self.commitlog.read([(parts.phy_offset, size)])
        if raw is None:
            raise MessageNotFoundError(f"no message with id {msg_id}")
        try:
            record = decode_record(raw)
        except Exception as exc:
            raise MessageNotFoundError(f"no message with id {msg_id}") from exc
        if record.phy_offset != parts.phy_offset:
            raise MessageNotFoundError(f"no message with id {msg_id}")
        return [record]

    async def _by_key(self, request: gateway_pb.QueryMessageRequest, max_count: int) -> list:
        config = await self.topics.get(request.topic)
        if config is None:
            raise TopicNotFoundError(f"topic {request.topic!r} does not exist")
        # Expired by the topic's retentionHours, or stored before the topic was last deleted:
        # still in a shared segment, but gone for readers.
        kept_from = int(time.time() * 1000) - config.retention_ms if config.retention_ms else 0
        deleted_before = (await self.commitlog.topic_tombstones()).get(request.topic, 0)
        offsets = await self.index.query_by_key(
            request.topic, request.key, request.begin_ms, request.end_ms, max_count
        )
        raws = await self.commitlog.read([(o, 0) for o in offsets]) if offsets else []
        out = []
        for raw in raws:
            if raw is None:
                continue
            record = decode_record(raw)
            if (
                record.topic == request.topic
                and (request.key in record.keys or record.uniq_key == request.key)
                and record.store_timestamp >= kept_from
                and record.phy_offset >= deleted_before
            ):
                out.append(record)
        return out

    async def _by_time(self, topic: str, timestamp_ms: int) -> list:
        config = await self.topics.get(topic)
        if config is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        out = []
        for qid in range(config.read_queue_nums):
            offset = await self.dispatch.offset_by_time(topic, qid, timestamp_ms)
            entries = await self.dispatch.get_entries(topic, qid, offset, 1)
            if entries.phy_offsets:
                (raw,) = await self.commitlog.read([(entries.phy_offsets[0], entries.sizes[0])])
                if raw is not None:
                    out.append(decode_record(raw))
        return out

    # -- admin ------------------------------------------------------------------------------------
    async def CreateTopic(
        self, request: gateway_pb.CreateTopicRequest, context: grpc.aio.ServicerContext
    ) -> common_pb.TopicConfig:
        self._admin("create or update topics")
        config = await self.commitlog.upsert_topic(convert.topic_from_pb(request.config))
        self.topics.forget(config.topic_name)
        return convert.topic_to_pb(config)

    async def DeleteTopic(
        self, request: commitlog_pb.DeleteTopicRequest, context: grpc.aio.ServicerContext
    ) -> commitlog_pb.DeleteTopicResponse:
        self._admin("delete topics")
        if not request.topic:
            raise InvalidArgumentError("topic must be non-empty")
        if is_system_topic(request.topic):
            raise InvalidArgumentError(
                f"{request.topic!r} is a system topic of the store and cannot be deleted"
            )
        deleted = await self.commitlog.delete_topic(request.topic)
        self.topics.forget(request.topic)
        return commitlog_pb.DeleteTopicResponse(deleted=deleted)

    async def UpsertSubscriptionGroup(
        self, request: dispatch_pb.SubscriptionGroup, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.SubscriptionGroup:
        self._admin("create or update subscription groups")
        return group_to_pb(await self.dispatch.upsert_group(group_from_pb(request)))

    async def ListTopics(
        self, request: commitlog_pb.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> commitlog_pb.ListTopicsResponse:
        account = self._caller()
        topics = await self.commitlog.list_topics()
        if account is not None:  # only what the account may use
            topics = [t for t in topics if account.may(PUB | SUB, t.topic_name)]
        return commitlog_pb.ListTopicsResponse(topics=[convert.topic_to_pb(t) for t in topics])

    async def GetConsumerProgress(
        self, request: dispatch_pb.GetConsumerProgressRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.ConsumerProgress:
        if not request.group:
            raise InvalidArgumentError("group must be non-empty")
        self._allow(SUB, request.topic, request.group)
        config = await self.topics.get(request.topic)
        if config is None:
            raise TopicNotFoundError(f"topic {request.topic!r} does not exist")
        progress = await self.dispatch.consumer_progress(request.group, request.topic, config.read_queue_nums)
        return progress_to_pb(request.group, request.topic, progress)

    async def GetQueueOffsets(
        self, request: gateway_pb.GetQueueOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb.GetQueueOffsetsResponse:
        self._allow(PUB | SUB, request.topic)
        config = await self.topics.get(request.topic)
        if config is None:
            raise TopicNotFoundError(f"topic {request.topic!r} does not exist")
        if request.timestamp_ms < 0:
            raise InvalidArgumentError("timestamp_ms must be >= 0")
        known = {q.queue_id: q for q in await self.dispatch.queue_info(request.topic)}
        out = []
        for qid in range(config.read_queue_nums):
            info = known.get(qid)
            lo, hi = (info.min_offset, info.max_offset) if info is not None else (0, 0)
            at = hi
            if request.timestamp_ms and hi > lo:
                at = await self.dispatch.offset_by_time(
                    request.topic, qid, request.timestamp_ms, BoundaryType.LOWER
                )
            out.append(gateway_pb.QueueOffsets(queue_id=qid, min_offset=lo, max_offset=hi, offset_at_time=at))
        return gateway_pb.GetQueueOffsetsResponse(queues=out)

    async def GetStoreStats(
        self, request: gateway_pb.GetStoreStatsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb.StoreStats:
        self._admin("read store statistics")
        offsets = await self.commitlog.offsets()
        dispatch = await self.dispatch.status()
        index = await self.index.status()
        topics = await self.commitlog.list_topics()
        return gateway_pb.StoreStats(
            commit_log_min_offset=offsets.min_offset,
            commit_log_max_offset=offsets.max_offset,
            confirm_offset=offsets.confirm_offset,
            flushed_offset=offsets.flushed_offset,
            dispatch_offset=dispatch.reput_offset,
            index_offset=index.reput_offset,
            topics=len(topics),
            flush_disk_type=offsets.flush_disk_type,
            broker_role=offsets.broker_role,
            disk_free_bytes=offsets.disk_free_bytes,
            disk_total_bytes=offsets.disk_total_bytes,
            quarantine_dir=offsets.quarantine_dir,
            quarantined_files=offsets.quarantined_files,
            quarantined_bytes=offsets.quarantined_bytes,
            disk_used_ratio=offsets.disk_used_ratio,
            disk_full=offsets.disk_full,
            last_cleanup_ms=offsets.last_cleanup_ms,
            cleanup_deleted_files=offsets.cleanup_deleted_files,
            cleanup_deleted_bytes=offsets.cleanup_deleted_bytes,
        )

    async def GetRoute(
        self, request: gateway_pb.GetRouteRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb.Route:
        self._allow(PUB | SUB, request.topic)
        config = await self.topics.get(request.topic)
        if config is None:
            raise TopicNotFoundError(f"topic {request.topic!r} does not exist")
        return gateway_pb.Route(topic=convert.topic_to_pb(config), endpoints=self.endpoints)


_SELECTED = (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE)
MAX_QUEUES_PER_PULL = 256  # queues one PullMany may name
PULL_MANY_MAX_BYTES = 4 * 1024 * 1024  # no further queue once a PullMany holds this much (each: 256 KiB)


def _selection(entries: Entries) -> UnitSelection:
    """The dispatch service's answer as the pull algorithm's step-3 result."""
    return UnitSelection(
        None if entries.status in _SELECTED else entries.status,
        entries.next_offset,
        entries.min_offset,
        entries.max_offset,
        entries.queue_offsets,
        entries.phy_offsets,
        entries.sizes,
    )


def _pull_response(
    reply: gateway_pb.PullResponse, result: GetMessageResult, offset: int, *, raw: bool, queue_id: int = 0
) -> gateway_pb.PullResponse:
    """Fill ``reply`` (a new PullResponse, or one added to a PullManyResponse in place: appending
    a built message would copy its records) with a pull's result: records as stored (``raw``)
    or decoded views; ``skipped`` counts what retention deleted before it was read (``offset``
    was the pull's start)."""
    too_small = result.status is GetMessageStatus.OFFSET_TOO_SMALL
    reply.status = PULL_STATUS_TO_PB[result.status]
    reply.next_offset = result.next_begin_offset
    reply.min_offset = result.min_offset
    reply.max_offset = result.max_offset
    reply.skipped = result.next_begin_offset - offset if too_small else result.removed
    reply.queue_id = queue_id
    if raw:
        reply.records.extend(result.records)
        reply.queue_offsets.extend(result.queue_offsets)
    else:
        reply.messages.extend(convert.record_to_view(r) for r in result.decode())
    return reply


_HEADER = struct.Struct(">ii")  # TOTALSIZE, MAGICCODE
_MESSAGE_MAGICS = (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)


def add_to_server(servicer: GatewayServicer, server: grpc.aio.Server) -> list[str]:
    gateway_grpc.add_GatewayServicer_to_server(servicer, server)
    return [SERVICE_NAME]


def _trace_publish(span: Span, topic: str, count: int) -> None:
    """Messaging attributes of a produce span (the topic when the request names one)."""
    span.set_attribute(message_trace.SYSTEM, message_trace.SYSTEM_NAME)
    span.set_attribute(message_trace.OPERATION, "publish")
    if topic:
        span.set_attribute(message_trace.DESTINATION, topic)
    if count:
        span.set_attribute(message_trace.BATCH_COUNT, count)


def _trace_delivery(span: Span, topic: str, group: str, raws: Sequence[bytes]) -> None:
    """Messaging attributes of a pull span, and links to the sends of the records it delivers
    (their ``traceparent`` properties, services._common.message_trace; the records are decoded
    again for that, on sampled calls only)."""
    span.set_attribute(message_trace.SYSTEM, message_trace.SYSTEM_NAME)
    span.set_attribute(message_trace.OPERATION, "receive")
    span.set_attribute(message_trace.DESTINATION, topic)
    span.set_attribute(message_trace.CONSUMER_GROUP, group)
    if not raws:
        return
    try:
        records = decode_records(list(raws), check_crc=False)
    except StoreError:  # a bad record is the pull's concern, not its trace's
        return
    if len(records) == 1:
        rec = records[0]
        span.set_attribute(message_trace.MESSAGE_ID, rec.msg_id)
        span.set_attribute(message_trace.PARTITION, str(rec.queue_id))
        span.set_attribute(message_trace.QUEUE_OFFSET, rec.queue_offset)
    for link in message_trace.links_to(message_trace.traceparent_of(r.properties) for r in records):
        span.add_link(link.context)
