"""Bounds on what a client controls, over real gRPC on 127.0.0.1: messages and bytes per
request (both Produce forms, RocketMQ 5 SendMessage), large record batches validated off the
event loop, produce bytes in flight (push back, and the client's retry after it), topic
creation (auto-create per role, a topic count, group names), one record per query by message id,
Telemetry outboxes and streams, held long polls, the commitlog Read call, and RocketMQ 5 error
messages that do not carry internals.

One bounded embedded suite serves most tests; each uses its own topic.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from libstore import InvalidArgumentError, MessageIllegalError, MessageNotFoundError, StoreConfig
from libstore.errors import SystemBusyError
from libstore.message_id import create_message_id
from services._common.errors import error_reason, retry_pushback_ms
from services.client import Admin, OutgoingMessage, Producer, PullConsumer
from services.commitlog.servicer import MAX_RELEASE_KEEP
from services.gateway.rocketmq.pb import Code, definition, service, service_grpc
from services.proto import commitlog_grpc, commitlog_pb, common_pb, dispatch_pb, gateway_grpc, gateway_pb
from services.serve import ServeOptions, Suite, store_config
from tests.service.harness import SMALL_STORE, InProcessSuites, wait_until

BOUNDS = {
    "maxMessagesPerRequest": 16,
    "maxRequestBytes": 2 * 1024 * 1024,
    "offloadValidationBytes": 64 * 1024,
    "maxPullBatchSize": 32,
    "maxReadRangesPerCall": 32,
    "maxReadBytesPerCall": 2 * 1024 * 1024,
    "maxHeldPolls": 100,
    "maxHeldPollsPerClient": 2,
    "telemetryOutboxMaxCommands": 4,
    "telemetryMaxStreamsPerClient": 2,
    "maxTopicCount": 40,
    "maxInflightProduceBytes": 2 * 1024 * 1024,
}
_topics = itertools.count()


def _topic(prefix: str) -> str:
    return f"{prefix}{next(_topics)}"


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessSuites, Suite]]:
    suites = InProcessSuites()
    options = ServeOptions(
        role="embedded",
        data_dir=tmp_path_factory.mktemp("bounded"),
        listen="127.0.0.1:0",
        store={**SMALL_STORE, **BOUNDS},
    )
    try:
        suite = suites.start(options)
        suites.wait_ready(suite)
        yield suites, suite
    finally:
        suites.close()


@pytest.fixture(scope="module")
def commitlog_role(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Suite]:
    """The commitlog role alone (split topology defaults), in this process."""
    suites = InProcessSuites()
    options = ServeOptions(
        role="commitlog",
        data_dir=tmp_path_factory.mktemp("commitlog"),
        listen="127.0.0.1:0",
        ha_listen="127.0.0.1:0",
        store={**SMALL_STORE, **BOUNDS},
    )
    try:
        suite = suites.start(options)
        yield suite
    finally:
        suites.close()


def _max_offset(suite: Suite) -> int:
    assert suite.commit_log is not None
    return suite.commit_log.max_offset


def _messages(topic: str, n: int, size: int = 10) -> list[OutgoingMessage]:
    return [OutgoingMessage(topic, bytes([i % 251]) * size) for i in range(n)]


# -- 1. messages and bytes per request; large record batches off the loop --------------------------
@pytest.mark.parametrize("encode_records", [True, False], ids=["records", "messages"])
def test_produce_over_the_message_or_byte_cap_is_refused_and_writes_nothing(
    bounded: tuple[InProcessSuites, Suite], encode_records: bool
) -> None:
    _, suite = bounded
    topic = _topic("Capped")
    with Admin(suite.address) as admin:
        admin.create_topic(topic, 2)
    with Producer(suite.address, encode_records=encode_records, retries=0) as producer:
        assert producer.send_batch(_messages(topic, 16)).all_ok  # at the cap: served
        before = _max_offset(suite)
        with pytest.raises((InvalidArgumentError, MessageIllegalError), match="at most 16"):
            producer.send_batch(_messages(topic, 17))
        with pytest.raises((InvalidArgumentError, MessageIllegalError), match="at most 2097152 bytes"):
            producer.send_batch(_messages(topic, 3, 900 * 1024))  # each body within maxMessageSize
        assert _max_offset(suite) == before


def test_a_large_record_batch_is_validated_on_a_worker_thread(
    bounded: tuple[InProcessSuites, Suite], monkeypatch: pytest.MonkeyPatch
) -> None:
    suites, suite = bounded
    log = suite.commit_log
    assert log is not None
    threads: list[int | None] = []
    adopt = log.adopt_records

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return adopt(*args, **kwargs)

    monkeypatch.setattr(log, "adopt_records", recording)
    topic = _topic("Offloaded")
    with Producer(suite.address, encode_records=True) as producer:
        assert producer.send_batch(_messages(topic, 2)).all_ok  # ~200 bytes: validated in place
        assert producer.send_batch(_messages(topic, 8, 16 * 1024)).all_ok  # 128 KiB > 64 KiB
    loop_thread = suites.loop.thread.ident
    assert len(threads) == 2
    assert threads[0] == loop_thread
    assert threads[1] != loop_thread


def _v2_message(topic: str, body: bytes, i: int) -> definition.Message:
    return definition.Message(
        topic=definition.Resource(name=topic),
        body=body,
        system_properties=definition.SystemProperties(message_id=f"01BOUNDS{i:024d}"),
    )


def test_v2_send_over_the_message_or_byte_cap_answers_bad_request_and_writes_nothing(
    bounded: tuple[InProcessSuites, Suite],
) -> None:
    _, suite = bounded
    topic = _topic("V2Capped")
    with Admin(suite.address) as admin:
        admin.create_topic(topic, 2)
    with grpc.insecure_channel(suite.address) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        ok = stub.SendMessage(
            service.SendMessageRequest(messages=[_v2_message(topic, b"x", i) for i in range(16)]), timeout=10
        )
        assert ok.status.code == Code.OK
        before = _max_offset(suite)
        many = stub.SendMessage(
            service.SendMessageRequest(messages=[_v2_message(topic, b"x", i) for i in range(17)]), timeout=10
        )
        assert many.status.code == Code.BAD_REQUEST
        assert "at most 16 messages" in many.status.message
        big = stub.SendMessage(
            service.SendMessageRequest(messages=[_v2_message(topic, bytes(900 * 1024), i) for i in range(3)]),
            timeout=10,
        )
        assert big.status.code == Code.MESSAGE_BODY_TOO_LARGE
    assert _max_offset(suite) == before


def test_produce_past_the_bytes_in_flight_is_pushed_back_writes_nothing_and_is_retried(
    bounded: tuple[InProcessSuites, Suite], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 1.4 MiB held (its durability wait gated here) a 0.7 MiB produce would pass
    maxInflightProduceBytes (2 MiB): both APIs refuse it before writing; the client retries
    after the hint and gets it in once the held call is answered."""
    _, suite = bounded
    port, admission = suite.commitlog_port, suite.admission
    assert port is not None and admission is not None
    release, appended = threading.Event(), threading.Event()
    wait_durable = port._wait_durable

    async def gated(results: Any) -> None:
        appended.set()  # the held batch is in the log: only its durability wait is left
        await asyncio.to_thread(release.wait, 30)
        await wait_durable(results)

    monkeypatch.setattr(port, "_wait_durable", gated)
    topic = _topic("PushedBack")
    body = 700 * 1024
    with Admin(suite.address) as admin:
        admin.create_topic(topic, 1)
    try:
        with (
            Producer(suite.address, retries=0) as held_producer,
            grpc.insecure_channel(suite.address) as channel,
        ):
            held = held_producer.send_batch_async(_messages(topic, 2, body))
            wait_until(appended.is_set, "the held produce")
            assert admission.inflight_bytes > 2 * body
            before = _max_offset(suite)
            with pytest.raises(SystemBusyError, match="maxInflightProduceBytes") as refused:
                held_producer.send_batch(_messages(topic, 1, body))
            assert refused.value.retry_after_ms > 0
            raw = gateway_pb.ProduceRequest(messages=[common_pb.Message(topic=topic, body=bytes(body))])
            with pytest.raises(grpc.RpcError) as raw_refused:
                gateway_grpc.GatewayStub(channel).Produce(raw, timeout=10)
            assert raw_refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_reason(raw_refused.value) == "SYSTEM_BUSY"
            assert retry_pushback_ms(raw_refused.value) == refused.value.retry_after_ms
            v2 = service_grpc.MessagingServiceStub(channel).SendMessage(
                service.SendMessageRequest(messages=[_v2_message(topic, bytes(body), 0)]), timeout=10
            )
            assert v2.status.code == Code.TOO_MANY_REQUESTS
            assert "maxInflightProduceBytes" in v2.status.message
            assert _max_offset(suite) == before  # none of the refused calls wrote a byte
            with Producer(suite.address, retries=20) as retrying:
                threading.Timer(0.3, release.set).start()
                assert retrying.send_batch(_messages(topic, 1, body)).all_ok
            assert held.result(timeout=30).all_ok
    finally:
        release.set()
    assert admission.inflight_bytes == 0
    got = []
    with PullConsumer(suite.address, "pushed-back", topic, batch_size=16, hold_ms=200) as consumer:
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            got += consumer.poll(500)
        got += consumer.poll(300)
    assert len(got) == 3  # the two held, the one retried: nothing lost, nothing twice


# -- 2. topics and groups ----------------------------------------------------------------------------
def test_auto_create_is_off_by_default_for_split_roles_and_on_for_the_embedded_suite(tmp_path: Path) -> None:
    def cfg(role: str, **store: object) -> StoreConfig:
        return store_config(ServeOptions(role=role, store=store), tmp_path)

    assert cfg("embedded").auto_create_topic_enable
    for role in ("commitlog", "dispatch", "index", "gateway"):
        assert not cfg(role).auto_create_topic_enable
    assert cfg("commitlog", autoCreateTopicEnable="true").auto_create_topic_enable
    assert not cfg("embedded", autoCreateTopicEnable="false").auto_create_topic_enable


def test_the_commitlog_role_refuses_appends_to_unknown_topics(commitlog_role: Suite) -> None:
    with grpc.insecure_channel(commitlog_role.address) as channel:
        stub = commitlog_grpc.CommitLogServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Append(
                commitlog_pb.AppendRequest(
                    messages=[common_pb.Message(topic="Unknown", body=b"x", queue_id=-1)]
                ),
                timeout=10,
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        topics = stub.ListTopics(commitlog_pb.ListTopicsRequest(), timeout=10).topics
        assert "Unknown" not in {t.topic for t in topics}


def test_a_tail_linger_out_of_range_is_refused(commitlog_role: Suite) -> None:
    with grpc.insecure_channel(commitlog_role.address) as channel:
        stub = commitlog_grpc.CommitLogServiceStub(channel)
        for linger_ms in (-1, 10_001):
            request = commitlog_pb.TailRequest(from_offset=0, linger_ms=linger_ms)
            with pytest.raises(grpc.RpcError) as err:
                next(iter(stub.Tail(request, timeout=10)))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "linger_ms" in (err.value.details() or "")


def test_topic_count_is_bounded_and_existing_topics_keep_working(tmp_path: Path) -> None:
    suites = InProcessSuites()
    try:
        options = ServeOptions(
            role="embedded",
            data_dir=tmp_path / "data",
            listen="127.0.0.1:0",
            store={**SMALL_STORE, "maxTopicCount": 3},
        )
        suite = suites.start(options)
        suites.wait_ready(suite)
        with Producer(suite.address, retries=0) as producer, Admin(suite.address) as admin:
            for name in ("Auto0", "Auto1", "Auto2"):  # auto-created by the put
                assert producer.send(name, b"x").all_ok
            with pytest.raises(InvalidArgumentError, match="maxTopicCount"):
                producer.send("Auto3", b"x")
            with pytest.raises(InvalidArgumentError, match="maxTopicCount"):
                admin.create_topic("Made3", 1)
            names = {t.topic_name for t in admin.list_topics()}
            assert {"Auto0", "Auto1", "Auto2"} <= names
            assert not {"Auto3", "Made3"} & names
            assert producer.send("Auto0", b"again").all_ok
            admin.create_topic("Auto1", 2)  # updating one is not creating one
    finally:
        suites.close()


def test_group_names_are_bounded_like_rocketmq(bounded: tuple[InProcessSuites, Suite]) -> None:
    _, suite = bounded
    topic = _topic("Groups")
    with Admin(suite.address) as admin:
        admin.create_topic(topic, 1)
    with grpc.insecure_channel(suite.address) as channel:
        stub = gateway_grpc.GatewayStub(channel)
        ok = dispatch_pb.CommitOffsetRequest(group="g" * 255, topic=topic, queue_id=0, offset=0)
        stub.CommitOffset(ok, timeout=10)
        for bad in ("g" * 256, "x" * (1024 * 1024), "has space", "a@b"):
            with pytest.raises(grpc.RpcError) as err:
                stub.CommitOffset(
                    dispatch_pb.CommitOffsetRequest(group=bad, topic=topic, queue_id=0, offset=0), timeout=10
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert suite.dispatch_app is not None
    assert all(len(group) <= 255 for group, _ in suite.dispatch_app.offsets.groups())


# -- 3. query by message id reads one record ---------------------------------------------------------
def test_a_forged_message_id_never_copies_more_than_one_record(
    bounded: tuple[InProcessSuites, Suite], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, suite = bounded
    topic = _topic("Forged")
    # A body whose bytes look like a record header claiming 1.25 MiB (more than the largest
    # record, 1 MiB + 64 KiB here), then enough records after it that those bytes exist.
    fake_size = 1280 * 1024
    body = fake_size.to_bytes(4, "big") + bytes(4) + b"forged" * 100
    log = suite.commit_log
    assert log is not None
    with Producer(suite.address) as producer:
        for _ in range(3):  # again if the forged bytes ended up at the end of a segment
            (phy,) = producer.send(topic, body).phy_offsets
            for _ in range(2):
                assert producer.send_batch(_messages(topic, 1, 900 * 1024)).all_ok
            body_at = phy + bytes(log.read_many([(phy, 0)])[0] or b"").index(body)
            uncapped = log.read_many([(body_at, 0)])[0]  # what an unchecked read copies
            if uncapped is not None and len(uncapped) == fake_size:
                break
        else:
            raise AssertionError("the forged header never had its bytes in one segment")
    port = suite.commitlog_port
    assert port is not None
    returned: list[int] = []
    read = port.read

    async def recording(ranges: Any) -> list[bytes | None]:
        out = await read(ranges)
        returned.extend(len(r) for r in out if r)
        return out

    monkeypatch.setattr(port, "read", recording)
    host = log.store_host
    with grpc.insecure_channel(suite.address) as channel:
        stub = gateway_grpc.GatewayStub(channel)
        for forged in (body_at, body_at + 8, phy + 1):
            with pytest.raises(grpc.RpcError) as err:
                stub.QueryMessage(
                    gateway_pb.QueryMessageRequest(msg_id=create_message_id(host, forged)), timeout=10
                )
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        real = stub.QueryMessage(
            gateway_pb.QueryMessageRequest(msg_id=create_message_id(host, phy)), timeout=10
        )
        assert [m.body for m in real.messages] == [body]
    assert returned and max(returned) <= 1024 * 1024 + 64 * 1024


# -- 4. Telemetry: bounded outboxes and streams per client -------------------------------------------
def _settings(topics: int) -> service.TelemetryCommand:
    names = [definition.Resource(name=f"T{i:0100d}") for i in range(topics)]
    return service.TelemetryCommand(
        settings=definition.Settings(
            client_type=definition.PRODUCER, publishing=definition.Publishing(topics=names)
        )
    )


def test_telemetry_streams_per_client_are_bounded(bounded: tuple[InProcessSuites, Suite]) -> None:
    _, suite = bounded
    metadata = [("x-mq-client-id", "streams@1")]
    release = threading.Event()

    def commands() -> Iterator[service.TelemetryCommand]:
        yield _settings(1)
        release.wait(30)  # the stream stays open, as a client's does

    with grpc.insecure_channel(suite.address) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        calls = []
        try:
            for _ in range(2):
                call = stub.Telemetry(commands(), metadata=metadata, timeout=30)
                calls.append(call)
                assert next(call).status.code == Code.OK
            refused = stub.Telemetry(commands(), metadata=metadata, timeout=30)
            calls.append(refused)
            first = next(refused)
            assert first.status.code == Code.TOO_MANY_REQUESTS
            assert "telemetryMaxStreamsPerClient" in first.status.message
        finally:
            release.set()
            for call in calls:
                call.cancel()


def test_a_client_that_does_not_read_its_telemetry_stream_does_not_grow_the_outbox(
    bounded: tuple[InProcessSuites, Suite],
) -> None:
    _, suite = bounded
    assert suite.messaging is not None
    client_id = "unread@1"
    sent = [0]
    command = _settings(2000)  # ~200 KB per command and per reply

    def commands() -> Iterator[service.TelemetryCommand]:
        for _ in range(300):
            sent[0] += 1
            yield command

    with grpc.insecure_channel(suite.address) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        call = stub.Telemetry(commands(), metadata=[("x-mq-client-id", client_id)], timeout=120)
        # The server stops reading once the outbox is full; wait until the client's sends stall
        # (or, without a bound, until everything was sent).
        last, still = -1, 0
        while sent[0] < 300 and still < 20:
            time.sleep(0.1)
            still = still + 1 if sent[0] == last else 0
            last = sent[0]
        sessions = suite.messaging.ctx.sessions.sessions_of(client_id)
        assert len(sessions) == 1
        assert sessions[0].outbox.qsize() <= BOUNDS["telemetryOutboxMaxCommands"]
        assert sent[0] < 300
        call.cancel()


# -- 5. held long polls ------------------------------------------------------------------------------
def _waiting(suite: Suite) -> int:
    assert suite.dispatch_app is not None
    return suite.dispatch_app.long_polling.waiting


def test_held_pulls_per_client_are_bounded(bounded: tuple[InProcessSuites, Suite]) -> None:
    _, suite = bounded
    topic = _topic("Held")
    with Admin(suite.address) as admin:
        admin.create_topic(topic, 1)
    base = _waiting(suite)
    pull = gateway_pb.PullRequest(
        group="holders", topic=topic, queue_id=0, offset=0, max_count=1, wait_ms=20_000
    )
    other = grpc.insecure_channel(suite.address, options=[("grpc.use_local_subchannel_pool", 1)])
    with grpc.insecure_channel(suite.address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        stub = gateway_grpc.GatewayStub(channel)
        held = [stub.Pull.future(pull, timeout=60) for _ in range(2)]
        wait_until(lambda: _waiting(suite) == base + 2, "two held pulls")
        with pytest.raises(grpc.RpcError) as err:
            stub.Pull(pull, timeout=60)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "maxHeldPollsPerClient" in (err.value.details() or "")
        # Another connection still gets its pull held, and a pull that finds messages is served.
        third = gateway_grpc.GatewayStub(other).Pull.future(pull, timeout=60)
        wait_until(lambda: _waiting(suite) == base + 3, "a third held pull on another connection")
        with Producer(suite.address) as producer:
            assert producer.send(topic, b"arrived").all_ok
        for call in [*held, third]:
            assert call.result(timeout=30).status == common_pb.PullStatus.Value("FOUND")
    other.close()


def test_held_v2_receives_per_client_are_bounded(bounded: tuple[InProcessSuites, Suite]) -> None:
    _, suite = bounded
    topic = _topic("HeldV2")
    with Admin(suite.address) as admin:
        admin.create_topic(topic, 2)
    base = _waiting(suite)
    request = service.ReceiveMessageRequest(
        group=definition.Resource(name="receivers"),
        message_queue=definition.MessageQueue(topic=definition.Resource(name=topic), id=-1),
        filter_expression=definition.FilterExpression(type=definition.TAG, expression="*"),
        batch_size=1,
        invisible_duration=_duration(30_000),
        long_polling_timeout=_duration(15_000),
    )
    metadata = [("x-mq-client-id", "receiver@1")]
    with grpc.insecure_channel(suite.address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        held = [stub.ReceiveMessage(request, metadata=metadata, timeout=60) for _ in range(2)]
        wait_until(lambda: _waiting(suite) == base + 2, "two held receives")
        refused = list(stub.ReceiveMessage(request, metadata=metadata, timeout=60))
        assert refused[0].status.code == Code.TOO_MANY_REQUESTS
        for call in held:
            call.cancel()


def _duration(ms: int) -> Any:
    from google.protobuf.duration_pb2 import Duration

    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


# -- 6. the commitlog Read call ----------------------------------------------------------------------
def test_commitlog_read_bounds_ranges_and_bytes(commitlog_role: Suite) -> None:
    with grpc.insecure_channel(commitlog_role.address) as channel:
        stub = commitlog_grpc.CommitLogServiceStub(channel)
        stub.UpsertTopic(
            commitlog_pb.UpsertTopicRequest(
                config=common_pb.TopicConfig(topic="Reads", read_queue_nums=1, write_queue_nums=1, perm=6)
            ),
            timeout=10,
        )
        reply = stub.Append(
            commitlog_pb.AppendRequest(
                messages=[
                    common_pb.Message(topic="Reads", body=bytes(900 * 1024), queue_id=0) for _ in range(3)
                ]
            ),
            timeout=10,
        )
        offsets = list(reply.results.phy_offsets)
        assert len(offsets) == 3
        two = stub.Read(commitlog_pb.ReadRequest(offsets=offsets[:2], sizes=[0, 0]), timeout=10)
        assert all(len(r) > 900 * 1024 for r in two.records)
        for offsets_asked in ([offsets[0]] * 33, offsets):
            with pytest.raises(grpc.RpcError) as err:
                stub.Read(
                    commitlog_pb.ReadRequest(offsets=offsets_asked, sizes=[0] * len(offsets_asked)),
                    timeout=10,
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # A range bigger than any record reads as nothing.
        huge = stub.Read(
            commitlog_pb.ReadRequest(offsets=[offsets[0]], sizes=[2 * 1024 * 1024 - 1]), timeout=10
        )
        assert huge.records == [b""]
        # A release names at most MAX_RELEASE_KEEP offsets to keep; nothing goes below 0.
        for bad in (
            commitlog_pb.ReleaseTransientRequest(below=1 << 40, keep=range(MAX_RELEASE_KEEP + 1)),
            commitlog_pb.ReleaseTransientRequest(below=-1),
        ):
            with pytest.raises(grpc.RpcError) as err:
                stub.ReleaseTransient(bad, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        fits = commitlog_pb.ReleaseTransientRequest(below=1 << 40, keep=range(MAX_RELEASE_KEEP))
        assert stub.ReleaseTransient(fits, timeout=10).released == 0  # this store holds none


# -- 7. RocketMQ 5 errors ----------------------------------------------------------------------------
def test_v2_internal_errors_do_not_leak_and_client_errors_keep_their_message(
    bounded: tuple[InProcessSuites, Suite], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _, suite = bounded
    topic = _topic("Leaky")
    with Admin(suite.address) as admin:
        admin.create_topic(topic, 1)
    assert suite.dispatch_app is not None

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret detail at /srv/data/pop/journal")

    monkeypatch.setattr(suite.dispatch_app.port, "pop", broken)
    request = service.ReceiveMessageRequest(
        group=definition.Resource(name="leaky"),
        message_queue=definition.MessageQueue(topic=definition.Resource(name=topic), id=-1),
        filter_expression=definition.FilterExpression(type=definition.TAG, expression="*"),
        batch_size=1,
        invisible_duration=_duration(30_000),
        long_polling_timeout=_duration(0),
    )
    with grpc.insecure_channel(suite.address) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        replies = list(stub.ReceiveMessage(request, timeout=10))
        status = replies[0].status
        assert status.code == Code.INTERNAL_SERVER_ERROR
        assert "secret" not in status.message and "RuntimeError" not in status.message
        correlation = status.message.rsplit(" ", 1)[-1]
        assert any(correlation in r.getMessage() for r in caplog.records)
        missing = stub.SendMessage(
            service.SendMessageRequest(messages=[_v2_message("NoSuchTopic", b"x", 0)]), timeout=10
        )
        assert missing.status.code == Code.TOPIC_NOT_FOUND
        assert "NoSuchTopic" in missing.status.message


def test_held_poll_refusal_maps_to_resource_exhausted() -> None:
    from libstore.errors import TooManyRequestsError
    from services._common.errors import status_code_of

    assert status_code_of(TooManyRequestsError("x")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_code_of(MessageNotFoundError("x")) == grpc.StatusCode.NOT_FOUND


def test_a_request_far_past_the_byte_cap_is_refused_before_it_is_read_in(
    bounded: tuple[InProcessSuites, Suite],
) -> None:
    """gRPC itself stops reading a request past maxRequestBytes (plus framing), instead of
    buffering up to its 64 MiB default first."""
    _, suite = bounded
    topic = _topic("Huge")
    with Admin(suite.address) as admin:
        admin.create_topic(topic, 1)
    before = _max_offset(suite)
    request = gateway_pb.ProduceRequest(records=bytes(6 * 1024 * 1024))  # past 2 MiB + 1 MiB framing
    options = [("grpc.max_send_message_length", 1 << 26)]
    with grpc.insecure_channel(suite.address, options=options) as ch, pytest.raises(grpc.RpcError) as refused:
        gateway_grpc.GatewayStub(ch).Produce(request, timeout=10)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _max_offset(suite) == before


def test_a_stopping_gateway_completes_telemetry_streams_with_ok(tmp_path: Path) -> None:
    """An orderly stop ends each Telemetry stream with OK before the server goes (a proxy's
    orderly shutdown): RocketMQ's Java client reopens a completed stream a second later; the
    Python client 5.1 only at its next settings sync (up to 300 s, see the README)."""
    suites = InProcessSuites()
    release = threading.Event()

    def commands() -> Iterator[service.TelemetryCommand]:
        yield _settings(1)
        release.wait(30)  # the stream stays open, as a client's does

    try:
        suite = suites.start(
            ServeOptions(role="embedded", data_dir=tmp_path / "d", listen="127.0.0.1:0", store=SMALL_STORE)
        )
        suites.wait_ready(suite)
        with grpc.insecure_channel(suite.address) as channel:
            stub = service_grpc.MessagingServiceStub(channel)
            call = stub.Telemetry(commands(), metadata=[("x-mq-client-id", "leaving@1")], timeout=30)
            assert next(call).status.code == Code.OK
            suites.stop(suite)
            assert list(call) == []  # nothing more: the stream completed
            assert call.code() == grpc.StatusCode.OK, call.details()
    finally:
        release.set()
        suites.close()
