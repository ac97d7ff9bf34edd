"""The fault loop's load: producers that remember every acknowledged message, a pull consumer
group (mqstore's own API) and a pop consumer group (the RocketMQ 5 protocol's receive and ack),
each remembering which messages it saw. All threads ride out outages: a failed call is counted
and tried again."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import grpc
from google.protobuf.duration_pb2 import Duration

from libstore import PutMessageStatus
from services.client import OutgoingMessage, Producer, PullConsumer
from services.gateway.rocketmq.pb import Code, definition, service, service_grpc


@dataclass(frozen=True)
class Acked:
    """Where the store said it put an acknowledged message (its key is the dict key)."""

    phy_offset: int
    size: int
    queue_offset: int


class Producers:
    """``threads`` producers sending batches of keyed messages to ``topic`` through the
    gateway; ``acked`` holds every message answered PUT_OK (SYNC_FLUSH and SYNC_MASTER: flushed
    on the master and held by the slave)."""

    def __init__(self, gateway: str, topic: str, threads: int = 2, batch: int = 8) -> None:
        self.gateway = gateway
        self.topic = topic
        self.batch = batch
        self.acked: dict[str, Acked] = {}
        self.acked_at: list[float] = []  # monotonic time of each batch answered PUT_OK
        self.statuses: dict[str, int] = {}
        self.errors = 0
        self._lock = threading.Lock()
        self._go = threading.Event()
        self._go.set()
        self._idle = [threading.Event() for _ in range(threads)]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def start(self) -> Producers:
        for t in self._threads:
            t.start()
        return self

    def _run(self, n: int) -> None:
        seq = 0
        producer = Producer(self.gateway, timeout_s=5, retries=1)
        try:
            while not self._stop.is_set():
                if not self._go.is_set():
                    self._idle[n].set()
                    self._go.wait(0.2)
                    continue
                self._idle[n].clear()
                keys = [f"p{n}-{seq + i}" for i in range(self.batch)]
                seq += self.batch
                body = (f"{keys[0]}|".encode() * 40)[:300]
                try:
                    results = producer.send_batch([OutgoingMessage(self.topic, body, keys=[k]) for k in keys])
                except Exception:
                    with self._lock:
                        self.errors += 1
                    time.sleep(0.1)
                    continue
                with self._lock:
                    name = results.status.name
                    self.statuses[name] = self.statuses.get(name, 0) + 1
                    if results.status is PutMessageStatus.PUT_OK:
                        self.acked_at.append(time.monotonic())
                        for k, phy, size, qoff in zip(
                            keys, results.phy_offsets, results.sizes, results.queue_offsets, strict=False
                        ):
                            self.acked[k] = Acked(phy, size, qoff)
                time.sleep(0.02)
        finally:
            producer.close()
            self._idle[n].set()

    def pause(self, timeout_s: float = 30.0) -> None:
        """Stop sending and wait until no batch is in flight."""
        self._go.clear()
        deadline = time.monotonic() + timeout_s
        for idle in self._idle:
            idle.wait(max(0.0, deadline - time.monotonic()))

    def resume(self) -> None:
        self._go.set()

    def stop(self) -> None:
        self._stop.set()
        self._go.set()
        for t in self._threads:
            t.join(30)

    def snapshot(self) -> dict[str, Acked]:
        with self._lock:
            return dict(self.acked)

    def first_ack_after(self, moment: float, timeout_s: float = 60.0) -> float:
        """Seconds from ``moment`` (monotonic) to the first batch acknowledged after it, waiting
        up to ``timeout_s``. Raises AssertionError when none comes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                later = [t for t in self.acked_at[-1000:] if t > moment]
            if later:
                return min(later) - moment
            time.sleep(0.05)
        raise AssertionError(f"no batch acknowledged within {timeout_s} s; statuses {self.statuses}")


class _Group:
    """A consumer thread that records the keys of what it received."""

    def __init__(self, gateway: str, group: str, topic: str) -> None:
        self.gateway = gateway
        self.group = group
        self.topic = topic
        self.seen: set[str] = set()
        self.deliveries = 0
        self.errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> _Group:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _record(self, keys: list[str]) -> None:
        with self._lock:
            self.seen.update(keys)
            self.deliveries += len(keys)

    def missing(self, keys: set[str]) -> set[str]:
        with self._lock:
            return keys - self.seen

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._consume()
            except Exception:
                with self._lock:
                    self.errors += 1
                time.sleep(0.3)

    def _consume(self) -> None:
        raise NotImplementedError


class PullGroup(_Group):
    """mqstore's PullConsumer (committing its offsets as it goes)."""

    def _consume(self) -> None:
        with PullConsumer(self.gateway, self.group, self.topic, hold_ms=500, timeout_s=5) as consumer:
            while not self._stop.is_set():
                records = consumer.poll(500)
                if records:
                    self._record([k for r in records for k in r.keys])
                    consumer.commit()


class PopGroup(_Group):
    """A simple consumer of the RocketMQ 5 protocol (ReceiveMessage, then AckMessage for each
    message), on our own generated stubs of apache.rocketmq.v2. ``after_ack`` lists the stored
    messages ((queue id, queue offset)) delivered again after an ack the store confirmed: the
    pop state (journaled in the CommitLog) must never let that happen, failovers included."""

    def __init__(self, gateway: str, group: str, topic: str) -> None:
        super().__init__(gateway, group, topic)
        self.acked: dict[tuple[int, int], tuple[str, float]] = {}  # slot -> (message id, when)
        self.after_ack: list[tuple[int, int, str, int, str, float]] = []

    def _consume(self) -> None:
        channel = grpc.insecure_channel(self.gateway)
        try:
            stub = service_grpc.MessagingServiceStub(channel)
            group = definition.Resource(name=self.group)
            topic = definition.Resource(name=self.topic)
            while not self._stop.is_set():
                request = service.ReceiveMessageRequest(
                    group=group,
                    message_queue=definition.MessageQueue(topic=topic, id=-1),
                    filter_expression=definition.FilterExpression(type=definition.TAG, expression="*"),
                    batch_size=32,
                    invisible_duration=Duration(seconds=4),
                    long_polling_timeout=Duration(seconds=1),
                )
                messages = []
                for reply in stub.ReceiveMessage(request, timeout=10):
                    if reply.WhichOneof("content") == "message":
                        messages.append(reply.message)
                    elif reply.WhichOneof("content") == "status" and reply.status.code not in (
                        Code.OK,
                        Code.MESSAGE_NOT_FOUND,
                    ):
                        raise RuntimeError(f"receive: {Code.Name(reply.status.code)} {reply.status.message}")
                if not messages:
                    continue
                self._record([k for m in messages for k in m.system_properties.keys])
                slots = [(m.system_properties.queue_id, m.system_properties.queue_offset) for m in messages]
                now = time.time()
                with self._lock:
                    for slot, m in zip(slots, messages, strict=True):
                        if slot in self.acked:
                            acked_id, acked_at = self.acked[slot]
                            sp = m.system_properties
                            self.after_ack.append(
                                (
                                    *slot,
                                    sp.message_id,
                                    sp.delivery_attempt,
                                    acked_id,
                                    round(now - acked_at, 1),
                                )
                            )
                entries = [
                    service.AckMessageEntry(
                        message_id=m.system_properties.message_id,
                        receipt_handle=m.system_properties.receipt_handle,
                    )
                    for m in messages
                ]
                answer = stub.AckMessage(
                    service.AckMessageRequest(group=group, topic=topic, entries=entries), timeout=10
                )
                now = time.time()
                with self._lock:
                    for slot, m, e in zip(slots, messages, answer.entries, strict=False):
                        if e.status.code == Code.OK:
                            self.acked[slot] = (m.system_properties.message_id, now)
        finally:
            channel.close()
