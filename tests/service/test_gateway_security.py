"""One trust model on the gateway's port: with an accounts file, mqstore's own API is signed and
authorized like the RocketMQ 5 protocol next to it; signatures expire and, for the own API,
cover the request; nobody produces into the store's own topics or properties; system, retry
and dead-letter topics are read only as their owners may (services.gateway.acl, .signature,
.caller; libstore.producer_input)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from libstore import (
    IllegalTopicError,
    InvalidArgumentError,
    Message,
    MessageIllegalError,
    MessageNotFoundError,
    PermissionDeniedError,
    TopicNotFoundError,
)
from libstore.message import MessageSysFlag
from libstore.record_encoder import STORE_HOST_PLACEHOLDER, RecordEncoder
from services.client import Admin, OutgoingMessage, Producer, PullConsumer
from services.credentials import Credentials, SignedGatewayStub
from services.gateway.rocketmq.pb import Code, definition, service, service_grpc
from services.gateway.signature import sign_own_request
from services.proto import commitlog_pb, common_pb, dispatch_pb, gateway_grpc, gateway_pb
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites, v2_signed, wait_derived_caught_up

ACL = """
accounts:
  - accessKey: writer
    secretKey: writer-secret
    topicPerms: [Orders=PUB]
  - accessKey: reader
    secretKey: reader-secret
    topicPerms: [Orders=SUB]
    groupPerms: [billing=SUB]
  - accessKey: outsider
    secretKey: outsider-secret
    topicPerms: [Public=PUB|SUB]
    groupPerms: [g1=SUB]
  - accessKey: ops
    secretKey: ops-secret
    admin: true
"""
WRITER = Credentials("writer", "writer-secret")
READER = Credentials("reader", "reader-secret")
OUTSIDER = Credentials("outsider", "outsider-secret")
OPS = Credentials("ops", "ops-secret")
PRODUCE = "/mqstore.v1.Gateway/Produce"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("secured")
    acl_file = root / "plain_acl.yml"
    acl_file.write_text(ACL)
    suites = InProcessSuites()
    try:
        options = embedded_options(root / "data")
        options.acl_file = acl_file
        suite = suites.start(options)
        suites.wait_ready(suite)
        with Admin(suite.address, credentials=OPS) as admin:
            admin.create_topic("Orders", 2)
            admin.create_topic("Public", 1)
            admin.create_topic("Payments", 1, message_type="TRANSACTION")
        yield suite.address
    finally:
        suites.close()


def _code(call: object) -> grpc.StatusCode:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as err:
        return err.code()  # type: ignore[attr-defined,no-any-return]
    return grpc.StatusCode.OK


def _max_offsets(address: str, topic: str) -> list[int]:
    """The max offset of each of ``topic``'s queues ([] while it does not exist)."""
    with Admin(address, credentials=OPS) as admin:
        try:
            return [q.max_offset for q in admin.queue_offsets(topic)]
        except TopicNotFoundError:
            return []


def test_the_own_api_refuses_unsigned_calls_and_writes_nothing(gateway: str) -> None:
    before = _max_offsets(gateway, "Orders")
    with grpc.insecure_channel(gateway) as channel:
        stub = gateway_grpc.GatewayStub(channel)
        message = common_pb.Message(topic="Orders", queue_id=0, body=b"anonymous")
        calls = {
            "create topic": lambda: stub.CreateTopic(
                gateway_pb.CreateTopicRequest(
                    config=common_pb.TopicConfig(topic="Anon", read_queue_nums=1, write_queue_nums=1, perm=6)
                ),
                timeout=5,
            ),
            "produce": lambda: stub.Produce(gateway_pb.ProduceRequest(messages=[message]), timeout=5),
            "pull": lambda: stub.Pull(
                gateway_pb.PullRequest(group="billing", topic="Orders", queue_id=0, offset=0, max_count=8),
                timeout=5,
            ),
            "pull many": lambda: stub.PullMany(
                gateway_pb.PullManyRequest(
                    group="billing", topic="Orders", queues=[gateway_pb.QueuePull(queue_id=0, max_count=8)]
                ),
                timeout=5,
            ),
            "disable group": lambda: stub.UpsertSubscriptionGroup(
                dispatch_pb.SubscriptionGroup(group_name="billing", consume_enable=False), timeout=5
            ),
            "change perm": lambda: stub.CreateTopic(
                gateway_pb.CreateTopicRequest(
                    config=common_pb.TopicConfig(
                        topic="Orders", read_queue_nums=2, write_queue_nums=2, perm=4
                    )
                ),
                timeout=5,
            ),
            "list": lambda: stub.ListTopics(commitlog_pb.ListTopicsRequest(), timeout=5),
            "stats": lambda: stub.GetStoreStats(gateway_pb.GetStoreStatsRequest(), timeout=5),
        }
        for what, call in calls.items():
            assert _code(call) == grpc.StatusCode.UNAUTHENTICATED, what
    with Admin(gateway, credentials=OPS) as admin:
        topics = {t.topic_name: t for t in admin.list_topics()}
    assert "Anon" not in topics and topics["Orders"].perm == 6  # nothing created or changed
    assert _max_offsets(gateway, "Orders") == before
    # The group was not disabled: its reader still pulls.
    with Producer(gateway, credentials=WRITER) as producer:
        producer.send("Orders", b"still-served")
    with PullConsumer(gateway, "billing", "Orders", credentials=READER, hold_ms=200) as consumer:
        bodies = _drain(consumer)
    assert b"still-served" in bodies


def _drain(consumer: PullConsumer, tries: int = 20) -> list[bytes]:
    out: list[bytes] = []
    for _ in range(tries):
        got = consumer.poll(300)
        if not got and out:
            break
        out += [m.body for m in got]
    return out


def test_each_account_does_what_its_permissions_allow_and_nothing_else(gateway: str) -> None:
    with Producer(gateway, credentials=WRITER) as producer:  # PUB on Orders: both produce forms
        producer.send("Orders", b"by-records")
    with Producer(gateway, credentials=WRITER, encode_records=False) as producer:
        producer.send("Orders", b"by-messages")
    with Producer(gateway, credentials=READER) as producer, pytest.raises(PermissionDeniedError):
        producer.send("Orders", b"reader-may-not")
    with (
        Producer(gateway, credentials=READER, encode_records=False) as producer,
        pytest.raises(PermissionDeniedError),
    ):
        producer.send("Orders", b"reader-may-not")
    with pytest.raises(PermissionDeniedError):  # PUB only: no reading
        PullConsumer(gateway, "billing", "Orders", credentials=WRITER).poll(100)
    with pytest.raises(PermissionDeniedError):  # the reader's group is billing, not others
        PullConsumer(gateway, "others", "Orders", queues=[0], credentials=READER).poll(100)
    with Admin(gateway, credentials=WRITER) as admin:
        with pytest.raises(PermissionDeniedError):
            admin.create_topic("Orders", 2, perm=4)  # would make the signed writer FORBIDDEN
        with pytest.raises(PermissionDeniedError):
            admin.create_topic("NewTopic", 1)
        with pytest.raises(PermissionDeniedError):
            admin.upsert_group("billing", consume_enable=False)
        with pytest.raises(PermissionDeniedError):
            admin.store_stats()
        assert [t.topic_name for t in admin.list_topics()] == ["Orders"]  # only what it may use
    with PullConsumer(gateway, "billing", "Orders", credentials=READER, hold_ms=200) as consumer:
        bodies = _drain(consumer)
        consumer.commit()
    assert {b"by-records", b"by-messages"} <= set(bodies)
    assert b"reader-may-not" not in bodies
    with Admin(gateway, credentials=OPS) as admin:
        assert admin.store_stats().topics >= 3


def _raw_produce(channel: grpc.Channel, raw: bytes, metadata: list[tuple[str, str]]) -> grpc.StatusCode:
    call = channel.unary_unary(PRODUCE, response_deserializer=gateway_pb.ProduceResponse.FromString)
    return _code(lambda: call(raw, metadata=metadata, timeout=5))


def test_an_own_api_signature_covers_its_request_and_expires(gateway: str) -> None:
    def request(body: bytes) -> bytes:
        return gateway_pb.ProduceRequest(
            messages=[common_pb.Message(topic="Orders", queue_id=0, body=body)]
        ).SerializeToString()

    before = _max_offsets(gateway, "Orders")
    signed = request(b"signed")
    metadata = sign_own_request("writer", "writer-secret", PRODUCE, signed)
    with grpc.insecure_channel(gateway) as channel:
        # The captured header does not carry another request, nor the same bytes to another method.
        assert _raw_produce(channel, request(b"tampered"), metadata) == grpc.StatusCode.UNAUTHENTICATED
        pull = channel.unary_unary("/mqstore.v1.Gateway/Pull")
        assert _code(lambda: pull(signed, metadata=metadata, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
        # Dates: an hour off either way, and not a date at all.
        for now in (time.time() - 3600, time.time() + 3600):
            old = sign_own_request("writer", "writer-secret", PRODUCE, signed, now_s=now)
            assert _raw_produce(channel, signed, old) == grpc.StatusCode.UNAUTHENTICATED
        garbled = [("x-mq-date-time", "not-a-date"), metadata[1]]
        assert _raw_produce(channel, signed, garbled) == grpc.StatusCode.UNAUTHENTICATED
        assert _max_offsets(gateway, "Orders") == before  # none of those wrote anything
        assert _raw_produce(channel, signed, metadata) == grpc.StatusCode.OK
    assert sum(_max_offsets(gateway, "Orders")) == sum(before) + 1


def _details(call: object) -> str:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as err:
        return err.details() or ""  # type: ignore[attr-defined,no-any-return]
    raise AssertionError("the call was not refused")


def test_refusals_do_not_tell_an_unknown_key_from_a_wrong_secret(gateway: str) -> None:
    with grpc.insecure_channel(gateway) as channel:
        stub_unknown = SignedGatewayStub(channel, Credentials("nobody", "x"))
        stub_wrong = SignedGatewayStub(channel, Credentials("writer", "guess"))
        request = gateway_pb.GetRouteRequest(topic="Orders")
        unknown = _details(lambda: stub_unknown.GetRoute(request, timeout=5))
        wrong = _details(lambda: stub_wrong.GetRoute(request, timeout=5))
        assert unknown == wrong and "nobody" not in unknown and "writer" not in wrong
        v2 = service_grpc.MessagingServiceStub(channel)
        route = service.QueryRouteRequest(topic=definition.Resource(name="Orders"))
        v2_unknown = v2.QueryRoute(route, metadata=v2_signed("nobody", "x"), timeout=5).status
        v2_wrong = v2.QueryRoute(route, metadata=v2_signed("writer", "guess"), timeout=5).status
        assert v2_unknown.code == v2_wrong.code == Code.UNAUTHORIZED
        assert v2_unknown.message == v2_wrong.message


def _v2_message(topic: str, body: bytes = b"x", **user: str) -> definition.Message:
    return definition.Message(
        topic=definition.Resource(name=topic),
        body=body,
        user_properties=user,
        system_properties=definition.SystemProperties(message_id=f"01{time.time_ns():030X}"[:32]),
    )


def test_a_rocketmq5_signature_expires(gateway: str) -> None:
    before = _max_offsets(gateway, "Orders")
    with grpc.insecure_channel(gateway) as channel:
        stub = service_grpc.MessagingServiceStub(channel)

        def send(metadata: list[tuple[str, str]]) -> int:
            reply = stub.SendMessage(
                service.SendMessageRequest(messages=[_v2_message("Orders")]), metadata=metadata, timeout=5
            )
            return reply.status.code

        assert send(v2_signed("writer", "writer-secret", "20000101T000000Z")) == Code.UNAUTHORIZED
        assert send(v2_signed("writer", "writer-secret", "not-a-date")) == Code.UNAUTHORIZED
        stale = time.strftime("%Y%m%dT%H%M%SZ", time.localtime(time.time() - 1800))
        assert send(v2_signed("writer", "writer-secret", stale)) == Code.UNAUTHORIZED
        assert _max_offsets(gateway, "Orders") == before
        assert send(v2_signed("writer", "writer-secret")) == Code.OK


SYSTEM_TOPICS = ["rmq_sys_timer_done", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "rmq_sys_pop_journal", "%DLQ%billing"]


def test_nobody_produces_into_the_stores_own_topics_or_properties(gateway: str) -> None:
    before = {t: _max_offsets(gateway, t) for t in ("rmq_sys_timer_done", "RMQ_SYS_TRANS_OP_HALF_TOPIC")}
    for encode_records in (True, False):  # even the admin, through both produce forms
        with Producer(gateway, credentials=OPS, encode_records=encode_records) as producer:
            for topic in SYSTEM_TOPICS:
                with pytest.raises(IllegalTopicError):
                    producer.send_batch([OutgoingMessage(topic, b"forged", properties={"TIMER_UNIT": "0"})])
            for name in ("TIMER_UNIT", "TRAN_HALF_OFFSET", "REAL_TOPIC", "POP_SEQ", "TIMER_OUT_MS"):
                with pytest.raises(MessageIllegalError, match=name):
                    producer.send_batch([OutgoingMessage("Orders", b"forged", properties={name: "0"})])
    with grpc.insecure_channel(gateway) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        ops = v2_signed("ops", "ops-secret")
        for topic in SYSTEM_TOPICS:
            reply = stub.SendMessage(
                service.SendMessageRequest(messages=[_v2_message(topic)]), metadata=ops, timeout=5
            )
            assert reply.status.code == Code.ILLEGAL_TOPIC, topic
        for name in ("TIMER_UNIT", "TRAN_HALF_OFFSET", "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "POP_SEQ"):
            reply = stub.SendMessage(
                service.SendMessageRequest(messages=[_v2_message("Orders", **{name: "5"})]),
                metadata=ops,
                timeout=5,
            )
            assert reply.status.code == Code.ILLEGAL_MESSAGE_PROPERTY_KEY, name
    for topic, offsets in before.items():
        assert _max_offsets(gateway, topic) == offsets


def test_a_producers_sys_flags_are_masked_to_its_own_bits(gateway: str) -> None:
    """A record claiming PREPARED (a half message: no queue offset, never consumable) and an
    inner batch is stored as an ordinary message of its queue."""
    encoder = RecordEncoder(STORE_HOST_PLACEHOLDER, max_message_size=1 << 20)
    flags = MessageSysFlag.TRANSACTION_PREPARED_TYPE | MessageSysFlag.INNER_BATCH_FLAG
    message = Message(
        "Public", b"claims-prepared", 0, properties={"UNIQ_KEY": f"U{time.time_ns()}"}, sys_flag=flags
    )
    raw = bytes(encoder.encode_batch([message], int(time.time() * 1000)).buf)
    with grpc.insecure_channel(gateway) as channel:
        stub = SignedGatewayStub(channel, OUTSIDER)
        reply = stub.Produce(gateway_pb.ProduceRequest(records=raw), timeout=5)
        assert list(reply.results.queue_offsets) == [0]  # a queue offset: not a half message
        pulled = stub.Pull(
            gateway_pb.PullRequest(
                group="g1", topic="Public", queue_id=0, offset=0, max_count=4, wait_ms=3000
            ),
            timeout=5,
        )
    assert [m.body for m in pulled.messages] == [b"claims-prepared"]
    assert (
        pulled.messages[0].sys_flag & (MessageSysFlag.TRANSACTION_TYPE_MASK | MessageSysFlag.INNER_BATCH_FLAG)
        == 0
    )


def test_system_retry_and_dead_letter_topics_are_read_only_as_their_owners_may(gateway: str) -> None:
    with grpc.insecure_channel(gateway) as channel:
        v2 = service_grpc.MessagingServiceStub(channel)

        def receive(ak: str, sk: str, topic: str, group: str) -> int:
            request = service.ReceiveMessageRequest(
                group=definition.Resource(name=group),
                message_queue=definition.MessageQueue(topic=definition.Resource(name=topic), id=-1),
                filter_expression=definition.FilterExpression(type=definition.TAG, expression="*"),
                batch_size=1,
                long_polling_timeout=Duration(seconds=0),
            )
            replies = list(v2.ReceiveMessage(request, metadata=v2_signed(ak, sk), timeout=5))
            return replies[0].status.code

        # The half and timer topics hold other topics' messages: admins only.
        for topic in ("RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_wheel_timer"):
            assert receive("outsider", "outsider-secret", topic, "g1") == Code.FORBIDDEN
        # defaultGroupPerm is DENY: an account consumes only as its own groups.
        assert receive("outsider", "outsider-secret", "Public", "billing") == Code.FORBIDDEN
        assert receive("outsider", "outsider-secret", "Public", "g1") in (Code.OK, Code.MESSAGE_NOT_FOUND)

        def pull(creds: Credentials, topic: str, group: str) -> grpc.StatusCode:
            stub = SignedGatewayStub(channel, creds)
            request = gateway_pb.PullRequest(group=group, topic=topic, queue_id=0, offset=0, max_count=1)
            return _code(lambda: stub.Pull(request, timeout=5))

        assert pull(OUTSIDER, "RMQ_SYS_TRANS_HALF_TOPIC", "g1") == grpc.StatusCode.PERMISSION_DENIED
        assert pull(OUTSIDER, "%DLQ%billing", "g1") == grpc.StatusCode.PERMISSION_DENIED
        # The group's own dead letters: allowed (the topic does not exist yet).
        assert pull(READER, "%DLQ%billing", "billing") == grpc.StatusCode.NOT_FOUND


def test_a_transaction_is_ended_only_for_its_named_topic(gateway: str) -> None:
    with grpc.insecure_channel(gateway) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        ops = v2_signed("ops", "ops-secret")
        message = definition.Message(
            topic=definition.Resource(name="Payments"),
            body=b"pending",
            system_properties=definition.SystemProperties(
                message_id=f"02{time.time_ns():030X}"[:32], message_type=definition.TRANSACTION
            ),
        )
        sent = stub.SendMessage(service.SendMessageRequest(messages=[message]), metadata=ops, timeout=5)
        assert sent.status.code == Code.OK
        end = service.EndTransactionRequest(
            message_id=message.system_properties.message_id,
            transaction_id=sent.entries[0].transaction_id,
            resolution=definition.COMMIT,
            source=definition.SOURCE_CLIENT,
        )
        # No topic: nothing to authorize against, so refused (it used to commit any topic's).
        assert stub.EndTransaction(end, metadata=ops, timeout=5).status.code == Code.ILLEGAL_TOPIC
        end.topic.name = "Payments"
        assert stub.EndTransaction(end, metadata=ops, timeout=5).status.code == Code.OK


def test_the_dispatch_transaction_calls_need_the_topic_they_act_for(tmp_path: Path) -> None:
    """Internal callers too: EndTransaction without a topic skipped the topic check, and a
    claim for no topics handed out every topic's half messages (and counted a check)."""
    suites = InProcessSuites()
    try:
        suite = suites.start(embedded_options(tmp_path / "data", transactionTimeOut=1))
        suites.wait_ready(suite)
        with Admin(suite.address) as admin:
            admin.create_topic("Payments", 1, message_type="TRANSACTION")
        message_id = f"03{time.time_ns():030X}"[:32]
        with grpc.insecure_channel(suite.address) as channel:
            half = definition.Message(
                topic=definition.Resource(name="Payments"),
                body=b"pending",
                system_properties=definition.SystemProperties(
                    message_id=message_id, message_type=definition.TRANSACTION
                ),
            )
            sent = service_grpc.MessagingServiceStub(channel).SendMessage(
                service.SendMessageRequest(messages=[half]), timeout=5
            )
        tid = sent.entries[0].transaction_id
        wait_derived_caught_up(suite)
        time.sleep(0.01)  # past the 1 ms transactionTimeOut: the check is due
        assert suite.dispatch_app is not None
        port = suite.dispatch_app.port
        assert suites.loop.run(port.claim_transaction_checks([])) == []
        (check,) = suites.loop.run(port.claim_transaction_checks(["Payments"]))
        assert check.transaction_id == tid and check.check_times == 1  # the empty claim counted nothing
        with pytest.raises(InvalidArgumentError, match="topic"):
            suites.loop.run(port.end_transaction(tid, message_id, True, ""))
        suites.loop.run(port.end_transaction(tid, message_id, True, "Payments"))
    finally:
        suites.close()


def test_the_cli_signs_with_the_account_it_is_given(gateway: str) -> None:
    from tests.service.test_cli import mqstore

    unsigned = mqstore("topic", "list", "-a", gateway)
    assert unsigned.returncode != 0 and "Traceback" not in unsigned.stderr
    assert unsigned.stderr.startswith("error:") and "signed" in unsigned.stderr
    as_writer = mqstore(
        "--access-key", "writer", "--secret-key", "writer-secret", "topic", "list", "-a", gateway
    )
    assert as_writer.returncode == 0, as_writer.stderr
    assert "Orders" in as_writer.stdout and "Payments" not in as_writer.stdout
    denied = mqstore("--access-key", "writer", "--secret-key", "writer-secret", "stats", "-a", gateway)
    assert denied.returncode != 0 and "admin only" in denied.stderr
    half = mqstore("--access-key", "writer", "topic", "list", "-a", gateway)
    assert half.returncode == 2 and "--secret-key" in half.stderr


def test_a_message_id_query_does_not_tell_what_an_account_may_not_read(gateway: str) -> None:
    with Producer(gateway, credentials=WRITER) as producer:
        (stored,) = producer.send("Orders", b"private")
    with Admin(gateway, credentials=OUTSIDER) as admin:
        with pytest.raises(MessageNotFoundError) as hidden:
            admin.query_by_id(stored.msg_id)  # exists, but on a topic it may not read
        forged = stored.msg_id[:-16] + f"{stored.phy_offset + 1:016X}"  # same host, one byte on
        with pytest.raises(MessageNotFoundError) as missing:
            admin.query_by_id(forged)  # no record starts there
    assert "Orders" not in str(hidden.value)
    assert str(hidden.value).replace(stored.msg_id, "ID") == str(missing.value).replace(forged, "ID")
    with Admin(gateway, credentials=READER) as admin:
        assert admin.query_by_id(stored.msg_id).body == b"private"
