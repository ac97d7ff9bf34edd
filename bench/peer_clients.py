"""The peers suite's clients: one :class:`bench.peer_workload.PeerClient` per broker, each the
usual Python client of that broker used the usual way.

* :class:`MqstoreClient`: our own client (services.client): one Produce call per batch or per
  message (``Producer.send_batch``), a :class:`PullConsumer` reading the topic's one queue.
* :class:`RedisStreamClient`: redis-py; a batch is one pipeline of XADDs, a single message one
  XADD; consumed with XRANGE, 1,000 entries a call.
* :class:`JetStreamClient`: nats-py; a batch is 1,000 ``publish_async`` then every PubAck, a single
  message one ``publish`` (waits for its PubAck); consumed by a pull consumer (no acks), 1,000 a
  fetch.
* :class:`RabbitStreamClient`: rstream (RabbitMQ's stream protocol); a batch is one
  ``send_batch`` then every publish confirm, a single message ``send_wait``; consumed from the
  stream's first offset.
* :class:`RabbitClassicClient`: pika on asyncio (AMQP 0-9-1); a durable classic queue, persistent
  messages, publisher confirms: a batch is 1,000 publishes then the confirms of all, a single
  message one publish and its confirm; consumed with a prefetch of 1,000, acked 500 at a time.

The peers' Python packages are the ``bench`` extra (``make bench-deps``) and are imported only when
a client opens: a missing one raises PeerUnavailable, and the suite reports the row as skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from bench.peer_servers import HOST, PeerServer, PeerUnavailable
from bench.peer_workload import CONSUME_IDLE_S, SequenceCheck, WorkloadError

READ_BATCH = 1_000  # messages per read call (XRANGE COUNT, JetStream fetch, AMQP prefetch)
ACK_TIMEOUT_S = 60.0  # longest wait for a batch's acknowledgements (s)
GUEST = ("guest", "guest")  # RabbitMQ's default user, allowed from loopback only


def import_client(module: str, package: str) -> ModuleType:
    """Import a peer's client module; PeerUnavailable naming the pip package when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PeerUnavailable(f"Python package {package} is not installed (make bench-deps)") from exc


async def _wait_for_count(done: asyncio.Event, check: SequenceCheck) -> None:
    """Wait for ``done`` while messages keep coming; return early after CONSUME_IDLE_S without
    any (the check then reports the shortfall)."""
    seen = -1
    while not done.is_set() and check.count != seen:
        seen = check.count
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), CONSUME_IDLE_S)


class MqstoreClient:
    """mqstore's gateway at ``address`` through services.client. ``floor``: the do-nothing server
    (no topic to create, the reply's counts are not checked, nothing to consume)."""

    def __init__(self, address: str, *, floor: bool = False) -> None:
        self.address = address
        self.floor = floor
        self._topic = ""
        self._producer: Any = None

    async def open(self, queue: str) -> None:
        """Create a topic with one queue named ``queue`` and connect a Producer."""
        from services.client import Admin, Producer

        self._topic = queue
        if not self.floor:
            with Admin(self.address) as admin:
                admin.create_topic(queue, 1)
        self._producer = Producer(self.address)

    async def produce_batch(self, bodies: Sequence[bytes]) -> None:
        """One Produce call carrying ``bodies``."""
        self._send(bodies)

    async def produce_one(self, body: bytes) -> None:
        """One Produce call carrying one message."""
        self._send((body,))

    def _send(self, bodies: Sequence[bytes]) -> None:
        from libstore import PutMessageStatus
        from services.client import OutgoingMessage

        results = self._producer.send_batch([OutgoingMessage(self._topic, body) for body in bodies])
        if results.status is not PutMessageStatus.PUT_OK or (
            not self.floor and results.appended != len(bodies)
        ):
            raise WorkloadError(f"Produce: {results.status.name}, {results.appended}/{len(bodies)} appended")

    async def consume(self, expected: int, check: SequenceCheck) -> None:
        """Read the topic's queue as a fresh group (pulls of up to READ_BATCH), in a process
        whose allocator keeps freed heap, as `mqstore consume` sets it."""
        from services.client import PullConsumer, tune_allocator

        tune_allocator()
        with PullConsumer(
            self.address, f"{self._topic}-group", self._topic, batch_size=READ_BATCH, hold_ms=500
        ) as consumer:
            idle_since = time.monotonic()
            while check.count < expected and time.monotonic() - idle_since < CONSUME_IDLE_S:
                records = consumer.poll(500)
                if records:
                    idle_since = time.monotonic()
                for record in records:
                    check.add(record.body)

    async def close(self) -> None:
        """Close the Producer (mqstore keeps the topic; its store is removed after the run)."""
        if self._producer is not None:
            self._producer.close()


class RedisStreamClient:
    """A Redis stream (key ``queue``), entries with one field ``b`` holding the body."""

    def __init__(self, server: PeerServer) -> None:
        self.port = server.port
        self._redis: Any = None
        self._key = ""

    async def open(self, queue: str) -> None:
        """Connect; the stream is created by its first XADD."""
        redis = import_client("redis", "redis")
        self._redis = redis.Redis(host=HOST, port=self.port)
        self._key = queue
        self._redis.delete(queue)

    async def produce_batch(self, bodies: Sequence[bytes]) -> None:
        """One pipeline (no MULTI) of XADDs; its replies are the acknowledgements."""
        pipe = self._redis.pipeline(transaction=False)
        for body in bodies:
            pipe.xadd(self._key, {b"b": body})
        pipe.execute()  # raises on the first error reply

    async def produce_one(self, body: bytes) -> None:
        """One XADD."""
        self._redis.xadd(self._key, {b"b": body})

    async def consume(self, expected: int, check: SequenceCheck) -> None:
        """XRANGE from the start, READ_BATCH entries a call, until ``expected`` or the end."""
        start = "-"
        while check.count < expected:
            entries = self._redis.xrange(self._key, min=start, max="+", count=READ_BATCH)
            if not entries:
                return
            for _entry_id, fields in entries:
                check.add(fields[b"b"])
            start = b"(" + entries[-1][0]  # exclusive range start (Redis 6.2+)

    async def close(self) -> None:
        """Delete the stream and disconnect."""
        if self._redis is not None:
            self._redis.delete(self._key)
            self._redis.close()


class JetStreamClient:
    """A JetStream stream named ``queue`` (file storage) on subject ``bench.<queue>``."""

    def __init__(self, server: PeerServer) -> None:
        self.port = server.port
        self._nc: Any = None
        self._js: Any = None
        self._stream = ""
        self._subject = ""

    async def open(self, queue: str) -> None:
        """Connect and add the stream (retried while JetStream is still starting)."""
        nats = import_client("nats", "nats-py")
        api = import_client("nats.js.api", "nats-py")
        self._nc = await nats.connect(f"nats://{HOST}:{self.port}", max_reconnect_attempts=0)
        self._js = self._nc.jetstream(timeout=ACK_TIMEOUT_S)
        self._stream, self._subject = queue, f"bench.{queue}"
        config = api.StreamConfig(name=queue, subjects=[self._subject], storage=api.StorageType.FILE)
        deadline = time.monotonic() + 30
        while True:
            try:
                await self._js.add_stream(config)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def produce_batch(self, bodies: Sequence[bytes]) -> None:
        """``publish_async`` every body, then wait for all their PubAcks."""
        futures = [await self._js.publish_async(self._subject, body) for body in bodies]
        await asyncio.wait_for(asyncio.gather(*futures), ACK_TIMEOUT_S)

    async def produce_one(self, body: bytes) -> None:
        """``publish``: one message, waits for its PubAck."""
        await self._js.publish(self._subject, body)

    async def consume(self, expected: int, check: SequenceCheck) -> None:
        """A pull consumer from the first message, no acks, READ_BATCH per fetch."""
        api = import_client("nats.js.api", "nats-py")
        nats_errors = import_client("nats.errors", "nats-py")
        config = api.ConsumerConfig(ack_policy=api.AckPolicy.NONE, deliver_policy=api.DeliverPolicy.ALL)
        sub = await self._js.pull_subscribe(self._subject, stream=self._stream, config=config)
        try:
            while check.count < expected:
                try:
                    msgs = await sub.fetch(min(READ_BATCH, expected - check.count), timeout=CONSUME_IDLE_S)
                except nats_errors.TimeoutError:
                    return
                for msg in msgs:
                    check.add(msg.data)
        finally:
            await sub.unsubscribe()

    async def close(self) -> None:
        """Delete the stream and disconnect."""
        if self._nc is not None:
            try:
                await self._js.delete_stream(self._stream)
            finally:
                await self._nc.close()


class RabbitStreamClient:
    """A RabbitMQ stream named ``queue``, over the stream protocol (rstream)."""

    def __init__(self, server: PeerServer) -> None:
        self.port = server.extra_ports["stream"]
        self._producer: Any = None
        self._stream = ""

    async def open(self, queue: str) -> None:
        """Connect a Producer and create the stream."""
        rstream = import_client("rstream", "rstream")
        self._producer = rstream.Producer(HOST, port=self.port, username=GUEST[0], password=GUEST[1])
        await self._producer.start()
        self._stream = queue
        await self._producer.create_stream(queue)

    async def produce_batch(self, bodies: Sequence[bytes]) -> None:
        """One ``send_batch``, then wait until every message is confirmed."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        remaining = [len(bodies)]
        refused: list[int] = []

        def confirmed(status: Any) -> None:
            if not status.is_confirmed:
                refused.append(status.response_code)
            remaining[0] -= 1
            if remaining[0] == 0 and not done.done():
                done.set_result(None)

        await self._producer.send_batch(self._stream, list(bodies), on_publish_confirm=confirmed)
        await asyncio.wait_for(done, ACK_TIMEOUT_S)
        if refused:
            raise WorkloadError(f"stream refused {len(refused)} messages (codes {sorted(set(refused))})")

    async def produce_one(self, body: bytes) -> None:
        """``send_wait``: one message, waits for its confirm."""
        await self._producer.send_wait(self._stream, body)

    async def consume(self, expected: int, check: SequenceCheck) -> None:
        """A Consumer subscribed from the stream's first offset."""
        rstream = import_client("rstream", "rstream")
        consumer = rstream.Consumer(HOST, port=self.port, username=GUEST[0], password=GUEST[1])
        await consumer.start()
        done = asyncio.Event()

        async def on_message(body: bytes, _context: Any) -> None:
            check.add(body)
            if check.count >= expected:
                done.set()

        try:
            first = rstream.ConsumerOffsetSpecification(rstream.OffsetType.FIRST, None)
            await consumer.subscribe(self._stream, on_message, offset_specification=first)
            await _wait_for_count(done, check)
        finally:
            await consumer.close()

    async def close(self) -> None:
        """Delete the stream and close the Producer."""
        if self._producer is not None:
            try:
                await self._producer.delete_stream(self._stream, missing_ok=True)
            finally:
                await self._producer.close()


class RabbitClassicClient:
    """A durable classic queue named ``queue`` over AMQP 0-9-1 (pika on asyncio), persistent
    messages, publisher confirms."""

    def __init__(self, server: PeerServer) -> None:
        self.port = server.port
        self._conn: Any = None
        self._channel: Any = None
        self._queue = ""
        self._props: Any = None
        self._published = 0  # publish sequence numbers handed out (the first is 1)
        self._confirmed = 0  # every sequence number up to this one is confirmed
        self._confirmed_singly: set[int] = set()  # confirmed beyond ``_confirmed``
        self._waiter: tuple[int, asyncio.Future[None]] | None = None
        self._failure: BaseException | None = None
        self._closed: asyncio.Future[None] | None = None  # set by close(): the close is expected

    async def open(self, queue: str) -> None:
        """Connect, open a channel in confirm mode and declare the queue."""
        pika = import_client("pika", "pika")
        adapter = import_client("pika.adapters.asyncio_connection", "pika")
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[Any] = loop.create_future()
        params = pika.ConnectionParameters(
            host=HOST, port=self.port, credentials=pika.PlainCredentials(*GUEST)
        )
        self._conn = adapter.AsyncioConnection(
            params,
            on_open_callback=lambda conn: _settle(opened, conn),
            on_open_error_callback=lambda _conn, err: _settle(opened, error=err),
            on_close_callback=self._on_connection_closed,
            custom_ioloop=loop,
        )
        await asyncio.wait_for(opened, ACK_TIMEOUT_S)
        self._channel = await self._call(lambda cb: self._conn.channel(on_open_callback=cb))
        self._channel.add_on_close_callback(lambda _ch, reason: self._fail(reason))
        await self._call(lambda cb: self._channel.confirm_delivery(self._on_confirm, callback=cb))
        await self._call(
            lambda cb: self._channel.queue_declare(
                queue, durable=True, arguments={"x-queue-type": "classic"}, callback=cb
            )
        )
        self._queue = queue
        self._props = pika.BasicProperties(delivery_mode=2)  # persistent

    async def _call(self, start: Callable[[Callable[[Any], None]], Any]) -> Any:
        """Run a pika call that reports completion through a callback; its argument is the result."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        start(lambda result: _settle(fut, result))
        return await asyncio.wait_for(fut, ACK_TIMEOUT_S)

    def _on_connection_closed(self, _conn: Any, reason: object) -> None:
        if self._closed is not None:
            _settle(self._closed, None)
        else:
            self._fail(reason)

    def _fail(self, reason: object) -> None:
        self._failure = WorkloadError(f"RabbitMQ closed the connection or channel: {reason}")
        if self._waiter is not None:
            _settle(self._waiter[1], error=self._failure)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if method.NAME == "Basic.Nack":
            self._fail(f"publish {method.delivery_tag} nacked")
            return
        if method.multiple:
            self._confirmed = max(self._confirmed, method.delivery_tag)
        else:
            self._confirmed_singly.add(method.delivery_tag)
        while self._confirmed + 1 in self._confirmed_singly:
            self._confirmed += 1
            self._confirmed_singly.discard(self._confirmed)
        if self._waiter is not None and self._confirmed >= self._waiter[0]:
            _settle(self._waiter[1], None)

    async def _publish(self, bodies: Sequence[bytes]) -> None:
        if self._failure is not None:
            raise self._failure
        for body in bodies:
            self._channel.basic_publish("", self._queue, body, self._props)
        self._published += len(bodies)
        if self._confirmed >= self._published:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter = (self._published, waiter)
        try:
            await asyncio.wait_for(waiter, ACK_TIMEOUT_S)
        finally:
            self._waiter = None

    async def produce_batch(self, bodies: Sequence[bytes]) -> None:
        """Publish ``bodies``, then wait until the broker confirms the last (and so every) one."""
        await self._publish(bodies)

    async def produce_one(self, body: bytes) -> None:
        """Publish one message and wait for its confirm."""
        await self._publish((body,))

    async def consume(self, expected: int, check: SequenceCheck) -> None:
        """basic.consume with a prefetch of READ_BATCH, acking every READ_BATCH // 2 (multiple)."""
        await self._call(lambda cb: self._channel.basic_qos(prefetch_count=READ_BATCH, callback=cb))
        done = asyncio.Event()

        def on_message(channel: Any, method: Any, _props: Any, body: bytes) -> None:
            check.add(body)
            if check.count % (READ_BATCH // 2) == 0 or check.count >= expected:
                channel.basic_ack(method.delivery_tag, multiple=True)
            if check.count >= expected:
                done.set()

        tag = self._channel.basic_consume(self._queue, on_message, auto_ack=False)
        await _wait_for_count(done, check)
        await self._call(lambda cb: self._channel.basic_cancel(tag, callback=cb))

    async def close(self) -> None:
        """Delete the queue and close the connection."""
        if self._conn is None:
            return
        try:
            if self._channel is not None and self._channel.is_open:
                await self._call(lambda cb: self._channel.queue_delete(self._queue, callback=cb))
        finally:
            if self._conn.is_open:
                self._closed = asyncio.get_running_loop().create_future()
                self._conn.close()
                await asyncio.wait_for(self._closed, ACK_TIMEOUT_S)


def _settle(fut: asyncio.Future[Any], result: Any = None, *, error: object = None) -> None:
    """Resolve ``fut`` once (later results are ignored); ``error`` (an exception or a reason)
    makes it raise."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error if isinstance(error, BaseException) else WorkloadError(str(error)))
    else:
        fut.set_result(result)
