"""The gateway API over real gRPC on 127.0.0.1, in both topologies: embedded (four services in
one process) and split (four processes). Each test uses its own topic."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from libstore import (
    IllegalTopicError,
    MessageIllegalError,
    MessageNotFoundError,
    OffsetOutOfRangeError,
    QueueIdOutOfRangeError,
    TopicNotFoundError,
)
from services._common.errors import error_reason
from services.client import Admin, OutgoingMessage, Producer, PullConsumer
from services.proto import common_pb, dispatch_pb, gateway_grpc, gateway_pb
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites, SplitCluster, poll_until, scrape, value, wait_until

_topics = itertools.count()


# Per gateway address: how many pulls its dispatch service holds now.
_HELD: dict[str, Callable[[], float]] = {}


@pytest.fixture(scope="module", params=["embedded", "split"])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp(request.param)
    if request.param == "embedded":
        suites = InProcessSuites()
        suite = suites.start(embedded_options(root))
        suites.wait_ready(suite)
        assert suite.dispatch_app is not None
        polling = suite.dispatch_app.long_polling
        _HELD[suite.address] = lambda: polling.waiting
        yield suite.address
        suites.close()
    else:
        cluster = SplitCluster(root, role_args={"dispatch": ["--metrics-listen", "127.0.0.1:0"]})
        cluster.start_all()
        endpoint = cluster.procs["dispatch"].metrics_address()
        _HELD[cluster.gateway] = lambda: value(scrape(endpoint), "mqstore_pull_held")
        yield cluster.gateway
        cluster.stop_all()


def _wait_held(gateway: str, pulls: int) -> None:
    """Wait until the dispatch service behind ``gateway`` holds ``pulls`` pulls."""
    held = _HELD[gateway]
    wait_until(lambda: held() >= pulls, f"{pulls} held pull(s)")


def _wait_none_held(gateway: str) -> None:
    """Wait until no pull of an earlier test is held (the server is shared by the module), so
    that a count of held pulls counts the test's own."""
    held = _HELD[gateway]
    wait_until(lambda: held() == 0, "earlier tests' held pulls to end", timeout_s=30)


def _topic(prefix: str) -> str:
    return f"{prefix}{next(_topics)}"


@pytest.mark.parametrize("encode_records", [True, False], ids=["records", "messages"])
def test_produce_then_pull_each_queue_in_order(gateway: str, encode_records: bool):
    topic = _topic("Orders")
    with Admin(gateway) as admin:
        admin.create_topic(topic, 4)
    with Producer(gateway, encode_records=encode_records) as producer:
        results = producer.send_batch(
            [OutgoingMessage(topic, f"m{i}".encode(), tags="t", keys=[f"k{i}"]) for i in range(40)]
        )
    assert results.all_ok and len(results) == 40
    assert [r.queue_offset for r in results] == [i // 4 for i in range(40)]  # round robin over 4 queues
    assert len({r.msg_id for r in results}) == 40
    with PullConsumer(gateway, "g", topic) as consumer:
        got = poll_until(consumer, 40, timeout_s=20)
    by_queue: dict[int, list[int]] = {}
    for rec in got:
        by_queue.setdefault(rec.queue_id, []).append(rec.queue_offset)
    assert sorted(rec.body for rec in got) == sorted(f"m{i}".encode() for i in range(40))
    assert all(offsets == list(range(10)) for offsets in by_queue.values()) and len(by_queue) == 4


def test_tag_filter_and_query_by_key_id_and_time(gateway: str):
    topic = _topic("Tagged")
    with Admin(gateway) as admin:
        admin.create_topic(topic, 4)  # the split topology does not auto-create topics
    with Producer(gateway) as producer:
        res = producer.send_batch(
            [
                OutgoingMessage(topic, b"x%d" % i, tags="A" if i % 3 else "B", keys=[f"key-{i}"], queue_id=0)
                for i in range(12)
            ]
        )
    assert res.all_ok
    with PullConsumer(gateway, "g", topic, tag_expression="B", queues=[0]) as consumer:
        got = poll_until(consumer, 4, timeout_s=20)
    assert [r.queue_offset for r in got] == [0, 3, 6, 9] and {r.tags for r in got} == {"B"}
    with Admin(gateway) as admin:
        deadline = time.monotonic() + 20
        while not (hits := admin.query_by_key(topic, "key-7")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the index service may lag a moment behind
        assert [h.body for h in hits] == [b"x7"] and list(hits[0].keys) == ["key-7"]
        by_id = admin.query_by_id(res[5].msg_id)
        assert by_id.body == b"x5" and by_id.queue_offset == 5
        by_time = admin.query_by_time(topic, hits[0].store_timestamp)
        assert by_time and by_time[0].queue_id == 0
        assert admin.query_by_key(topic, "nothing") == []


def test_a_key_is_found_as_soon_as_its_put_is_acknowledged(gateway: str):
    """The index follows the log in chunks of up to 10 ms; a query first waits until what the
    log confirmed before it is indexed, so the put just acknowledged is found, every time."""
    topic = _topic("Found")
    with Admin(gateway) as admin:
        admin.create_topic(topic, 1)
        with Producer(gateway) as producer:
            for i in range(10):
                assert producer.send(topic, b"at once %d" % i, keys=[f"now-{i}"]).all_ok
                assert [v.body for v in admin.query_by_key(topic, f"now-{i}")] == [b"at once %d" % i]


def test_committed_offsets_and_progress(gateway: str):
    topic = _topic("Progress")
    with Admin(gateway) as admin:
        admin.create_topic(topic, 2)
    with Producer(gateway) as producer:
        assert producer.send_batch([OutgoingMessage(topic, b"p", queue_id=i % 2) for i in range(10)]).all_ok
    with PullConsumer(gateway, "grp", topic, batch_size=3, queues=[1]) as consumer:
        first = poll_until(consumer, 1, timeout_s=20)  # the first non-empty batch (3 at most)
        consumer.commit()
    with Admin(gateway) as admin:
        progress = {q.queue_id: q for q in admin.consumer_progress("grp", topic).queues}
    assert progress[1].committed_offset == len(first) == 3 and progress[1].lag == 2
    assert progress[0].committed_offset == -1 and progress[0].lag == 5
    with PullConsumer(gateway, "grp", topic, queues=[1]) as again:  # resumes at the commit
        rest = poll_until(again, 2, timeout_s=20)
    assert [r.queue_offset for r in rest] == [3, 4]


def test_long_polling_pull_returns_when_a_message_arrives(gateway: str):
    topic = _topic("Held")
    with Admin(gateway) as admin:
        admin.create_topic(topic, 1)
    channel = grpc.insecure_channel(gateway)
    stub = gateway_grpc.GatewayStub(channel)
    request = gateway_pb.PullRequest(
        group="g", topic=topic, queue_id=0, offset=0, max_count=8, wait_ms=20_000
    )
    _wait_none_held(gateway)
    future = stub.Pull.future(request, timeout=30)
    _wait_held(gateway, 1)
    assert not future.done()
    t0 = time.monotonic()
    with Producer(gateway) as producer:
        producer.send(topic, b"wake up", queue_id=0)
    reply = future.result(timeout=25)
    assert time.monotonic() - t0 < 15, "woken by the message, not by the hold time"
    assert reply.status == common_pb.FOUND and [m.body for m in reply.messages] == [b"wake up"]
    empty = stub.Pull(
        gateway_pb.PullRequest(group="g", topic=topic, queue_id=0, offset=1, max_count=8, wait_ms=200)
    )
    assert empty.status == common_pb.OFFSET_OVERFLOW_ONE and empty.next_offset == 1
    channel.close()


def test_poll_after_a_pause_waits_for_what_arrives_meanwhile(gateway: str):
    """A poll sends the next pull before it returns; when the caller comes back after that
    pull's hold has run out empty, the poll waits on for the pull that replaces it and returns
    the message that arrived meanwhile, instead of the stale empty reply."""
    topic = _topic("Paused")
    with Admin(gateway) as admin:
        admin.create_topic(topic, 1)
    with Producer(gateway) as producer, PullConsumer(gateway, "g", topic, hold_ms=300) as consumer:
        assert producer.send(topic, b"first").all_ok
        assert [r.body for r in poll_until(consumer, 1, timeout_s=20)] == [b"first"]
        time.sleep(1.0)  # the pull sent before the poll returned is answered empty meanwhile
        assert producer.send(topic, b"later").all_ok
        t0 = time.monotonic()
        got = consumer.poll(10_000)
        assert [r.body for r in got] == [b"later"]
        assert time.monotonic() - t0 < 8, "woken by the message, not by the poll's timeout"
        consumer.commit()
    with Admin(gateway) as admin:
        progress = {q.queue_id: q for q in admin.consumer_progress("g", topic).queues}
    assert progress[0].committed_offset == 2 and progress[0].lag == 0


def _pull_many(stub, topic: str, queues: list[tuple[int, int]], **fields) -> gateway_pb.PullManyResponse:
    request = gateway_pb.PullManyRequest(
        group="g",
        topic=topic,
        queues=[gateway_pb.QueuePull(queue_id=q, offset=o, max_count=100) for q, o in queues],
        **fields,
    )
    return stub.PullMany(request, timeout=30)


def test_pull_many_answers_each_queue_as_pull_does(gateway: str):
    topic = _topic("Many")
    with Admin(gateway) as admin:
        admin.create_topic(topic, 4)
    with Producer(gateway) as producer:
        producer.send_batch([OutgoingMessage(topic, f"m{i}".encode(), tags="t") for i in range(40)])
    with PullConsumer(gateway, "dispatched", topic) as consumer:  # PullMany through the client
        assert len(poll_until(consumer, 40, timeout_s=20)) == 40
    with grpc.insecure_channel(gateway) as channel:
        stub = gateway_grpc.GatewayStub(channel)
        order = [(2, 0), (0, 3), (3, 0), (1, 0)]
        reply = _pull_many(stub, topic, order)
        assert [r.queue_id for r in reply.results] == [2, 0, 3, 1]
        for (queue_id, offset), result in zip(order, reply.results, strict=True):
            alone = stub.Pull(
                gateway_pb.PullRequest(
                    group="g", topic=topic, queue_id=queue_id, offset=offset, max_count=100, raw=True
                )
            )
            assert (result.status, result.next_offset, result.max_offset) == (
                alone.status,
                alone.next_offset,
                alone.max_offset,
            )
            assert list(result.records) == list(alone.records) and result.records
            assert list(result.queue_offsets) == list(range(offset, alone.next_offset))
        # Past max_bytes no queue is started: the first is answered whole, the rest left out.
        first = _pull_many(stub, topic, order, max_bytes=1)
        assert [r.queue_id for r in first.results] == [2]
        assert list(first.results[0].records) == list(reply.results[0].records)
        # An offset past the end answers as Pull does, and the consumer's committed offset (-1)
        # starts a queue the group never committed at its min offset.
        edge = _pull_many(stub, topic, [(1, 1000), (3, -1)])
        assert edge.results[0].status == common_pb.OFFSET_OVERFLOW_BADLY
        assert list(edge.results[1].queue_offsets)[:1] == [0]


def test_pull_many_is_held_until_any_of_its_queues_has_a_message(gateway: str):
    topic = _topic("ManyHeld")
    with Admin(gateway) as admin:
        admin.create_topic(topic, 3)
    with grpc.insecure_channel(gateway) as channel:
        stub = gateway_grpc.GatewayStub(channel)
        request = gateway_pb.PullManyRequest(
            group="g",
            topic=topic,
            queues=[gateway_pb.QueuePull(queue_id=q, offset=0, max_count=8) for q in (0, 1, 2)],
            wait_ms=20_000,
        )
        _wait_none_held(gateway)
        future = stub.PullMany.future(request, timeout=30)
        _wait_held(gateway, 1)
        assert not future.done()
        t0 = time.monotonic()
        with Producer(gateway) as producer:
            producer.send(topic, b"wake up", queue_id=2)
        reply = future.result(timeout=25)
        assert time.monotonic() - t0 < 15, "woken by the message, not by the hold time"
        found = [r for r in reply.results if r.records]
        assert [r.queue_id for r in found] == [2] and len(found[0].records) == 1
        empty = _pull_many(stub, topic, [(0, 0), (1, 0)], wait_ms=200)
        assert [r.status for r in empty.results] == [common_pb.NO_MESSAGE_IN_QUEUE] * 2


def test_pull_many_refuses_what_a_pull_would_and_more(gateway: str):
    topic = _topic("ManyBad")
    with Admin(gateway) as admin:
        admin.create_topic(topic, 2)
    with grpc.insecure_channel(gateway) as channel:
        stub = gateway_grpc.GatewayStub(channel)
        for queues, fields in [
            ([], {}),  # no queue
            ([(0, 0), (0, 5)], {}),  # the same queue twice
            ([(0, -2)], {}),
            ([(0, 0)], {"wait_ms": -1}),
        ]:
            with pytest.raises(grpc.RpcError) as bad:
                _pull_many(stub, topic, queues, **fields)
            assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT, (queues, fields)
        with pytest.raises(grpc.RpcError) as out_of_range:
            _pull_many(stub, topic, [(0, 0), (7, 0)])
        assert out_of_range.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as missing:
            _pull_many(stub, _topic("NoSuchTopic"), [(0, 0)])
        assert missing.value.code() is grpc.StatusCode.NOT_FOUND


def test_a_consumer_falls_back_to_a_pull_per_queue_without_pull_many(
    gateway: str, monkeypatch: pytest.MonkeyPatch
):
    """Against a gateway from before PullMany (UNIMPLEMENTED: here, a method the gateway does
    not have), the consumer goes on with one Pull per queue and loses nothing."""
    topic = _topic("Fallback")
    with Admin(gateway) as admin:
        admin.create_topic(topic, 4)
    with Producer(gateway) as producer:
        producer.send_batch([OutgoingMessage(topic, f"m{i}".encode()) for i in range(40)])

    def pull_unknown(self: PullConsumer, queues: tuple[int, ...], wait_ms: int) -> grpc.Future:
        unknown = self._conn.channel.unary_unary("/mqstore.v1.Gateway/PullManyFromTheFuture")
        return unknown.future(b"", timeout=5)

    monkeypatch.setattr(PullConsumer, "_pull_set", pull_unknown)
    with PullConsumer(gateway, "fallback", topic, hold_ms=200) as consumer:
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 40 and time.monotonic() < deadline:
            got += consumer.poll(500)
        assert not consumer._pull_many
    assert sorted(r.body for r in got) == sorted(f"m{i}".encode() for i in range(40))


def test_bad_input_gets_clear_codes_and_writes_nothing(gateway: str):
    topic = _topic("Bad")
    channel = grpc.insecure_channel(gateway)
    stub = gateway_grpc.GatewayStub(channel)
    with Admin(gateway) as admin:
        admin.create_topic(topic, 2)
        before = admin.store_stats().commit_log_max_offset

        def code_of(call, request) -> tuple[grpc.StatusCode, str | None]:
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=10)
            return info.value.code(), error_reason(info.value)

        big = common_pb.Message(topic=topic, queue_id=0, body=b"x" * (1024 * 1024 + 1))
        assert code_of(stub.Produce, gateway_pb.ProduceRequest(messages=[big])) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "MESSAGE_ILLEGAL",
        )
        bad_topic = common_pb.Message(topic="no spaces allowed", queue_id=0, body=b"x")
        assert code_of(stub.Produce, gateway_pb.ProduceRequest(messages=[bad_topic])) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "TOPIC_ILLEGAL",
        )
        bad_queue = common_pb.Message(topic=topic, queue_id=7, body=b"x")
        ok = common_pb.Message(topic=topic, queue_id=0, body=b"fine")
        assert code_of(stub.Produce, gateway_pb.ProduceRequest(messages=[ok, bad_queue])) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "QUEUE_ID_ILLEGAL",
        )
        pull = gateway_pb.PullRequest(group="g", topic="NoSuchTopic", queue_id=0, offset=0, max_count=1)
        assert code_of(stub.Pull, pull)[0] == grpc.StatusCode.NOT_FOUND
        pull = gateway_pb.PullRequest(group="g", topic=topic, queue_id=0, offset=0, max_count=0)
        assert code_of(stub.Pull, pull)[0] == grpc.StatusCode.INVALID_ARGUMENT
        commit = dispatch_pb.CommitOffsetRequest(group="g", topic=topic, queue_id=0, offset=99)
        assert code_of(stub.CommitOffset, commit) == (grpc.StatusCode.OUT_OF_RANGE, "OFFSET_ILLEGAL")
        query = gateway_pb.QueryMessageRequest(msg_id="7F0000010000000000000000FFFFFFFF")
        assert code_of(stub.QueryMessage, query)[0] == grpc.StatusCode.NOT_FOUND
        assert admin.store_stats().commit_log_max_offset == before, "nothing of a refused batch was written"
    channel.close()
    # The client maps the same statuses back to libstore's exceptions.
    with Producer(gateway) as producer, Admin(gateway) as admin:
        with pytest.raises(MessageIllegalError):
            producer.send(topic, b"x" * (2 * 1024 * 1024), queue_id=0)
        with pytest.raises(IllegalTopicError):
            producer.send("bad topic", b"x")
        with pytest.raises(QueueIdOutOfRangeError):
            producer.send(topic, b"x", queue_id=5)
        with pytest.raises(MessageNotFoundError):
            admin.query_by_id("7F0000010000000000000000FFFFFFFF")
        with pytest.raises(TopicNotFoundError):
            admin.consumer_progress("g", "NoSuchTopic")
        with pytest.raises(OffsetOutOfRangeError):
            admin.commit_offset("g", topic, 0, 10**6)


@pytest.mark.parametrize("encode_records", [True, False], ids=["records", "messages"])
def test_delay_levels_and_delivery_times_hold_messages_until_due(gateway: str, encode_records: bool):
    topic = _topic("Delayed")
    with Admin(gateway) as admin:
        admin.create_topic(topic, 2)
    with Producer(gateway, encode_records=encode_records) as producer:
        sent_ms = time.time_ns() // 1_000_000
        now = producer.send(topic, b"now", queue_id=0)
        level1 = producer.send(topic, b"level-1", queue_id=0, delay_level=1)  # RocketMQ level 1: 1 s
        at = producer.send(topic, b"at", queue_id=1, deliver_at_ms=sent_ms + 2000)
        assert now.all_ok and level1.all_ok and at.all_ok
        with pytest.raises(MessageIllegalError):  # levels are 1..18; nothing is written
            producer.send(topic, b"bad", delay_level=-1)
    with PullConsumer(gateway, "g", topic) as consumer:
        first = consumer.poll(500)
        polled_ms = time.time_ns() // 1_000_000
        assert first and first[0].body == b"now"
        if polled_ms < sent_ms + 1000:  # neither is due yet: both are held
            assert [r.body for r in first] == [b"now"]
        got = first[1:]  # a slow machine may already be past the 1 s of level 1
        got += poll_until(consumer, 2 - len(got), timeout_s=20)
    by_body = {r.body: r for r in got}
    assert sorted(by_body) == [b"at", b"level-1"]
    assert by_body[b"level-1"].store_timestamp >= sent_ms + 1000
    assert by_body[b"at"].store_timestamp >= sent_ms + 2000
    assert by_body[b"at"].queue_id == 1 and by_body[b"level-1"].queue_id == 0  # the queues asked for
    # The copy delivered keeps the producer's properties and says when the timer let it out.
    props = by_body[b"level-1"].properties
    assert props["DELAY"] == "1" and props["UNIQ_KEY"] and int(props["TIMER_OUT_MS"]) >= sent_ms + 1000
    assert "REAL_TOPIC" not in props


def test_health_and_reflection(gateway: str):
    channel = grpc.insecure_channel(gateway)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "mqstore.v1.Gateway"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
    )
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"mqstore.v1.Gateway", "grpc.health.v1.Health"} <= names
    channel.close()
