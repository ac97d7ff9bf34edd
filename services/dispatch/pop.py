"""PopService: the pop consumption model on the dispatch service (receive, ack, change invisible
time, dead-letter forwarding) over libstore.pop_state and this process's ConsumeQueues.

The state lives here, next to the ConsumeQueues and consumer offsets it refers to, so gateways
hold no delivery state and several of them can serve one group; its changes are journaled in the
CommitLog (services.dispatch.pop_journal), so every replica's dispatch holds it and a promoted
slave carries on where its master stopped. Every operation waits for its journal record before
it answers. Only the master's dispatch serves operations (a slave's raises NotMasterError). A pop for queue -1
(what the gateway always asks: RocketMQ's proxy pops by broker, whatever queue the client named)
serves every queue of the topic, starting from a rotating queue so no queue starves; when
nothing is deliverable it holds on the long-polling service until a message arrives on the
topic, an in-flight message becomes visible again, or the wait ends (a change of invisible time
wakes it too: the message may now come back sooner than the hold it computed). Messages that
used up the group's attempts (found by the next pop, or by the revive scan every second) are
copied to ``%DLQ%<group>`` through the CommitLog (properties ``DLQ_ORIGIN_TOPIC``/
``DLQ_ORIGIN_MESSAGE_ID`` as RocketMQ 5 writes them) and then finished for the group. A message
whose dead-letter copy the store refuses for good (its properties leave no room for the three
the copy adds, say) is parked in ``rmq_sys_quarantine`` instead, with its body, where it came
from and the reason (``QUARANTINE_REASON``), counted in ``mqstore.dispatch.quarantined``, and
finished all the same: a poison message never blocks its group.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from libstore import Message
from libstore.aio_deadline import wait_within
from libstore.consume_queue import ConsumeQueue
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.consumer_offset_manager import ConsumerOffsetManager
from libstore.errors import (
    InvalidArgumentError,
    MessageIllegalError,
    ServiceNotAvailableError,
    StoreError,
)
from libstore.group_name import MAX_GROUP_NAME_LENGTH, validate_group
from libstore.long_polling import LongPollingService
from libstore.message import MessageConst
from libstore.message_filter import TagFilter
from libstore.pop_state import Popped, PopState, ReceiptHandle
from libstore.record_codec import decode_record
from libstore.results import PutMessageStatus
from libstore.subscription_group import (
    CONSUME_FROM_EARLIEST,
    DLQ_GROUP_TOPIC_PREFIX,
    SubscriptionGroupConfig,
    SubscriptionGroupManager,
    dlq_topic,
)
from libstore.system_topics import QUARANTINE_TOPIC
from services._common.telemetry import meter, tracer
from services.dispatch.pop_journal import PopJournal
from services.dispatch.receipt_signer import ReceiptSigner
from services.ports import NACK_INVISIBLE_MS, CommitLogPort, PoppedMessage, PopResult

log = logging.getLogger(__name__)

REVIVE_INTERVAL_S = 1.0
CLOSE_WAIT_S = 5.0  # how long close() waits for background journal commits
QUARANTINE_REASON = "QUARANTINE_REASON"  # on a parked copy: why it could not be delivered or dead-lettered
QUARANTINE_GROUP = "QUARANTINE_GROUP"  # the consumer group it was parked for
ORIGIN_QUEUE = "ORIGIN_QUEUE"  # "<queue id>:<queue offset>:<CommitLog offset>" of the original
# Put outcomes that no retry changes: the copy itself is what the store refuses.
_REFUSED_FOR_GOOD = (PutMessageStatus.MESSAGE_ILLEGAL, PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)
MAX_POP_BATCH = 1024
MAX_INVISIBLE_MS = 12 * 3600 * 1000  # RocketMQ's proxy allows up to 12 hours


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class PopService:
    """Pop, ack and dead-letter over ``queues``; state under ``root``; DLQ copies appended
    through ``commitlog``. ``clock()`` gives ms since the epoch. Receipt handles are signed
    for their group and topic by ``signer`` (by default with the key under ``root``, see
    services.dispatch.receipt_signer); one that does not verify is InvalidReceiptHandleError."""

    def __init__(
        self,
        root: Path,
        queues: ConsumeQueueStore,
        offsets: ConsumerOffsetManager,
        long_polling: LongPollingService,
        commitlog: CommitLogPort,
        *,
        reput_offset: Callable[[], int] = lambda: 1 << 62,
        clock: Callable[[], int] = _now_ms,
        max_group_length: int = MAX_GROUP_NAME_LENGTH,
        signer: ReceiptSigner | None = None,
        in_memory_bytes: int = 0,
    ) -> None:
        self.signer = signer or ReceiptSigner.load(Path(root))
        self._reput_offset = reput_offset
        # How far behind the log's end a record still counts as in memory (RocketMQ's
        # accessMessageInMemoryMaxRatio of the machine's RAM): see _initial_offset.
        self.in_memory_bytes = in_memory_bytes
        self.queues = queues
        self.max_group_length = max_group_length
        self.long_polling = long_polling
        self.commitlog = commitlog
        self.clock = clock
        self.state = PopState(
            Path(root) / "pop", commit_offset=offsets.commit_offset, committed_offset=offsets.query_offset
        )
        self.journal = PopJournal(self.state, queues, commitlog, reput_offset)
        self.groups = SubscriptionGroupManager(Path(root) / "config" / "subscriptionGroup.json")
        self._rotation = itertools.count()
        self._background: set[asyncio.Task[None]] = set()
        self._tracer = tracer("mqstore.dispatch")
        self._quarantined = meter("mqstore.dispatch").create_counter(
            "mqstore.dispatch.quarantined",
            unit="{message}",
            description="messages parked in rmq_sys_quarantine: neither deliverable nor dead-letterable",
        )

    def load(self) -> None:
        self.groups.load()
        self.journal.load()

    def start(self) -> None:
        self.journal.start()

    async def close(self) -> None:
        if self._background:  # abandoned deliveries being given back: before the journal stops
            await asyncio.wait(list(self._background), timeout=CLOSE_WAIT_S)
            while self._background:  # those still waiting (a catch-up): they come back later
                tasks = list(self._background)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        await self.journal.close()

    # -- pop ----------------------------------------------------------------------------------------
    async def pop(
        self,
        group: str,
        topic: str,
        queue_id: int,
        *,
        tag_expression: str = "*",
        max_count: int = 32,
        invisible_ms: int = 60_000,
        wait_ms: int = 0,
    ) -> PopResult:
        """See DispatchPort.pop. Raises InvalidArgumentError for a bad group, topic, count,
        invisible time or expression; ServiceNotAvailableError when the group may not consume."""
        if not topic:
            raise InvalidArgumentError("topic must be non-empty")
        if not 1 <= max_count <= MAX_POP_BATCH:
            raise InvalidArgumentError(f"max_count must be within 1..{MAX_POP_BATCH}, got {max_count}")
        if not 0 < invisible_ms <= MAX_INVISIBLE_MS:
            raise InvalidArgumentError(f"invisible time must be within 1..{MAX_INVISIBLE_MS} ms")
        if wait_ms < 0:
            raise InvalidArgumentError("wait_ms must be >= 0")
        validate_group(group, self.max_group_length)
        config = self.groups.get(group)
        if not config.consume_enable:
            raise ServiceNotAvailableError(f"consumer group {group} is not allowed to consume")
        filt = TagFilter(tag_expression)
        deadline = self.clock() + wait_ms
        with self._tracer.start_as_current_span("dispatch.pop") as span:
            span.set_attribute("mqstore.group", group)
            while True:
                await self.journal.ready()
                before = self._topic_max_offsets(topic)
                popped = self._pop_once(group, topic, queue_id, filt, max_count, invisible_ms, config)
                live = [p for p in popped if not p.dead]
                try:
                    await self.journal.commit()
                    if len(live) < len(popped):
                        await self._forward(group, [p for p in popped if p.dead])
                except asyncio.CancelledError:
                    self._abandon(group, topic, live)  # the caller went away with them
                    raise
                now = self.clock()
                if live or now >= deadline:
                    span.set_attribute("mqstore.messages", len(live))
                    messages = [
                        _message(p, self.signer.sign(group, p.topic, p.handle.encode())) for p in live
                    ]
                    return PopResult(messages, fifo=config.consume_message_orderly)
                if popped:
                    continue  # only dead letters this round: look again at once
                wake_at = self.state.next_visible_at(group, topic)
                hold = deadline - now if wake_at is None else max(1, min(deadline, wake_at + 1) - now)
                span.add_event("long polling", {"mqstore.hold_ms": hold})
                held = await self.long_polling.wait_for_topic_async(
                    topic, hold, functools.partial(self._topic_moved, topic, before)
                )
                if not held:  # maxHeldPolls are held already: answer now, empty
                    span.add_event("long polling refused")
                    return PopResult([], fifo=config.consume_message_orderly)

    def _abandon(self, group: str, topic: str, taken: Sequence[Popped]) -> None:
        """Deliveries taken for a caller that went away before they were answered (a receive
        cancelled by its client's disconnect): visible again after ``NACK_INVISIBLE_MS``
        instead of their whole invisible time, as RocketMQ's proxy nacks a message it could not
        write to the client. Done in the background, once the journal is ready, as every
        other change of the state: a record made while a reloaded state is still catching up
        would take a seq past the journal records it has yet to fold, and they would then be
        passed over as already held."""
        if not taken:
            return
        task = asyncio.create_task(self._give_back(group, topic, list(taken)))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _give_back(self, group: str, topic: str, taken: list[Popped]) -> None:
        try:
            await self.journal.ready()
            now = self.clock()
            for p in taken:
                with contextlib.suppress(StoreError):  # finished meanwhile: nothing to give back
                    self.state.change_invisible(group, topic, p.handle, NACK_INVISIBLE_MS, now)
            await self.journal.commit()
        except StoreError as exc:  # they come back after their original invisible time
            log.warning("abandoned deliveries of %s were not given back: %s", topic, exc)
        self.long_polling.wake_topic(topic)

    def _topic_moved(self, topic: str, before: tuple[int, ...]) -> bool:
        return self._topic_max_offsets(topic) != before

    def _topic_max_offsets(self, topic: str) -> tuple[int, ...]:
        return tuple(cq.max_offset_in_queue for cq in self.queues.queues_of(topic))

    def _pop_once(
        self,
        group: str,
        topic: str,
        queue_id: int,
        filt: TagFilter,
        max_count: int,
        invisible_ms: int,
        config: SubscriptionGroupConfig,
    ) -> list[Popped]:
        cqs = self.queues.queues_of(topic, queue_id)
        if len(cqs) > 1:
            start = next(self._rotation) % len(cqs)
            cqs = cqs[start:] + cqs[:start]
        out: list[Popped] = []
        now = self.clock()
        for cq in cqs:
            out += self.state.pop(
                group,
                topic,
                cq.queue_id,
                read_units=cq.read_units,
                min_offset=cq.min_offset_in_queue,
                max_offset=cq.max_offset_in_queue,
                max_count=max_count - len(out),
                invisible_ms=invisible_ms,
                now_ms=now,
                matches_code=filt.matches_code,
                fifo=config.consume_message_orderly,
                max_attempts=config.max_delivery_attempts,
                initial_offset=functools.partial(self._initial_offset, config, cq),
            )
            if len(out) >= max_count:
                break
        return out

    def _initial_offset(self, config: SubscriptionGroupConfig, cq: ConsumeQueue) -> int:
        """Where ``config``'s group starts in ``cq`` without an offset (RocketMQ's pop
        getInitOffset): ``earliest`` (and dead-letter queues), the min offset; ``latest``, the
        last message (max offset - 1), unless the queue is young (its min offset is 0 and its
        first message still within ``in_memory_bytes`` of the log's end: RocketMQ's "offset 0 is
        still in memory"), then 0, so a group that starts right after the first sends sees them."""
        lo, hi = cq.min_offset_in_queue, cq.max_offset_in_queue
        if config.consume_from == CONSUME_FROM_EARLIEST or cq.topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
            return lo
        if lo <= 0:
            first = cq.read_unit(0)
            if first is not None and self._reput_offset() - first.phy_offset <= self.in_memory_bytes:
                return 0
        return max(lo, hi - 1)

    # -- ack / change ---------------------------------------------------------------------------------
    async def ack(self, group: str, topic: str, receipt_handles: Sequence[str]) -> list[StoreError | None]:
        await self.journal.ready()
        now = self.clock()
        out: list[StoreError | None] = []
        for text in receipt_handles:
            try:
                self.state.ack(
                    group, topic, ReceiptHandle.decode(self.signer.verify(group, topic, text)), now
                )
                out.append(None)
            except StoreError as exc:
                out.append(exc)
        await self.journal.commit(durable=True)  # raises: none of them counts as acked
        if self.groups.get(group).consume_message_orderly and any(e is None for e in out):
            # FIFO: the ack unblocks its message group; a receive parked on the topic (a FIFO
            # push consumer always keeps one) looks again now, as RocketMQ notifies on an
            # orderly ack, instead of sleeping out its long-polling hold.
            self.long_polling.wake_topic(topic)
        return out

    async def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
            raise InvalidArgumentError(f"invisible time must be within 0..{MAX_INVISIBLE_MS} ms")
        handle = ReceiptHandle.decode(self.signer.verify(group, topic, receipt_handle))
        await self.journal.ready()
        new = self.state.change_invisible(group, topic, handle, invisible_ms, self.clock())
        await self.journal.commit()
        # A held pop sleeps until the earliest visible time it saw; this one may be earlier.
        self.long_polling.wake_topic(topic)
        return self.signer.sign(group, topic, new.encode())

    async def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> None:
        """Raises InvalidReceiptHandleError for an expired, superseded or foreign handle, or a
        message already acked (PopState.in_flight: the record copied is the one the store
        delivered, not whatever the handle text names)."""
        handle = ReceiptHandle.decode(self.signer.verify(group, topic, receipt_handle))
        await self.journal.ready()
        await self._forward(group, [self.state.in_flight(group, topic, handle, self.clock())])

    async def _forward(self, group: str, dead: list[Popped]) -> None:
        """Copy ``dead`` to the group's DLQ (one read, one append), then finish them for the
        group (at-least-once: a crash between the two copies them again on the next round).
        A copy the store refuses for good is parked in the quarantine topic instead (module
        doc). Raises ServiceNotAvailableError when an append failed for a reason that may pass
        (they stay in flight)."""
        with self._tracer.start_as_current_span("dispatch.forward_to_dlq") as span:
            span.set_attribute("mqstore.messages", len(dead))
            raws = await self.commitlog.read([(p.phy_offset, p.size) for p in dead])
            held = [(p, raw) for p, raw in zip(dead, raws, strict=True) if raw]
            refused = await self._append_copies(group, held)
            if refused:
                span.set_attribute("mqstore.quarantined", len(refused))
                parked = [_parked(group, p, raw, why) for p, raw, why in refused]
                await self._append_all(parked, QUARANTINE_TOPIC)
                self._quarantined.add(len(parked), {"group": group})
                for p, _, why in refused:
                    log.error(
                        "group %s: message %s:%d:%d parked in %s: %s",
                        group,
                        p.topic,
                        p.queue_id,
                        p.queue_offset,
                        QUARANTINE_TOPIC,
                        why,
                    )
            await self.journal.ready()
            for p in dead:  # a record the log no longer holds has nothing left to forward
                self.state.finish(group, p.topic, p.queue_id, p.queue_offset, p.handle.seq)
            await self.journal.commit()

    async def _append_copies(
        self, group: str, held: list[tuple[Popped, bytes]]
    ) -> list[tuple[Popped, bytes, str]]:
        """Append the DLQ copies of ``held``; returns those the store refused for good, with
        the reason. Raises ServiceNotAvailableError for any other failure."""
        copies: list[tuple[Popped, bytes, Message | None, str]] = []
        for p, raw in held:
            try:
                copies.append((p, raw, _dead_letter(group, p, raw), ""))
            except StoreError as exc:  # the record itself does not decode into a message
                copies.append((p, raw, None, f"cannot copy the record: {exc}"))
        refused = [(p, raw, why) for p, raw, m, why in copies if m is None]
        good = [(p, raw, m) for p, raw, m, _ in copies if m is not None]
        try:
            batches = [good] if good else []
            results = [await self.commitlog.append([m for _, _, m in good])] if good else []
        except MessageIllegalError:  # one of them: find which, one append each
            batches, results = [], []
            for item in good:
                try:
                    results.append(await self.commitlog.append([item[2]]))
                    batches.append([item])
                except MessageIllegalError as exc:
                    refused.append((item[0], item[1], f"the store refused its dead-letter copy: {exc}"))
        for batch, result in zip(batches, results, strict=True):
            for (p, raw, _), r in zip(batch, result, strict=True):
                if r.status in _REFUSED_FOR_GOOD:
                    refused.append((p, raw, f"the store refused its dead-letter copy: {r.status.name}"))
                elif not r.status.appended:
                    raise ServiceNotAvailableError(
                        f"forwarding to {dlq_topic(group)} failed: {r.status.name}"
                    )
        return refused

    async def _append_all(self, messages: list[Message], where: str) -> None:
        results = await self.commitlog.append(messages)
        failed = [r.status.name for r in results if not r.status.appended]
        if failed:
            raise ServiceNotAvailableError(f"appending to {where} failed: {failed[0]}")

    async def revive(self) -> int:
        """Forward every expired in-flight message that used up its group's attempts to the
        group's DLQ; returns how many were forwarded. Run every ``REVIVE_INTERVAL_S``."""
        try:
            await self.journal.ready()
        except ServiceNotAvailableError:  # NotMasterError included
            return 0  # a slave's dispatch follows the master's journal; or still catching up
        by_group: dict[str, list[Popped]] = {}
        for group, p in self.state.expired(self.clock(), lambda g: self.groups.get(g).max_delivery_attempts):
            by_group.setdefault(group, []).append(p)
        for group, dead in by_group.items():
            await self._forward(group, dead)
        return sum(len(d) for d in by_group.values())

    async def run_revive(self, stop: asyncio.Event) -> None:
        """Call :meth:`revive` every ``REVIVE_INTERVAL_S`` until ``stop`` is set; failures are
        logged and retried on the next round (the messages stay in flight meanwhile)."""
        while not stop.is_set():
            try:
                await self.revive()
            except Exception:
                log.exception("pop revive failed; retrying in %.0f s", REVIVE_INTERVAL_S)
            with contextlib.suppress(TimeoutError):
                await wait_within(stop.wait(), REVIVE_INTERVAL_S)

    # -- groups ---------------------------------------------------------------------------------------
    async def upsert_group(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Create or replace a group's config. Raises InvalidArgumentError for a bad group name
        (libstore.group_name)."""
        validate_group(config.group_name, self.max_group_length)
        return self.groups.upsert(config)

    async def get_group(self, group: str) -> SubscriptionGroupConfig:
        return self.groups.get(group)


def _dead_letter(group: str, p: Popped, raw: bytes) -> Message:
    """The ``%DLQ%<group>`` copy of a popped record, with RocketMQ 5's origin properties."""
    rec = decode_record(raw, check_crc=False)
    props = dict(rec.properties)
    props[MessageConst.DLQ_ORIGIN_TOPIC] = rec.topic
    props[MessageConst.DLQ_ORIGIN_MESSAGE_ID] = rec.uniq_key or rec.msg_id
    props[MessageConst.RETRY_TOPIC] = rec.topic
    return rec.to_message(
        topic=dlq_topic(group), queue_id=0, properties=props, sys_flag=0, reconsume_times=p.attempt
    )


def _parked(group: str, p: Popped, raw: bytes, reason: str) -> Message:
    """The quarantine copy of a popped record: its body (as far as the record yields one), its
    origin and ``reason``; none of its own properties, so the copy always fits."""
    try:
        rec = decode_record(raw, check_crc=False)
        body, origin_id, tags = rec.body, rec.uniq_key or rec.msg_id, rec.tags
    except StoreError:
        body, origin_id, tags = b"", "", None
    props = {
        QUARANTINE_REASON: reason[:2048],
        QUARANTINE_GROUP: group,
        MessageConst.DLQ_ORIGIN_TOPIC: p.topic,
        MessageConst.DLQ_ORIGIN_MESSAGE_ID: origin_id,
        ORIGIN_QUEUE: f"{p.queue_id}:{p.queue_offset}:{p.phy_offset}",
    }
    return Message(QUARANTINE_TOPIC, body, 0, tags=tags, properties=props, reconsume_times=p.attempt)


def _message(p: Popped, receipt_handle: str) -> PoppedMessage:
    return PoppedMessage(
        p.queue_id, p.queue_offset, p.phy_offset, p.size, p.attempt, receipt_handle, p.handle.visible_at
    )
