"""Poison messages never block their group: a message that can be neither delivered nor
dead-lettered is parked in rmq_sys_quarantine with the reason (services.dispatch.pop), a
protocol that cannot convert a stored record moves it aside instead of failing the whole batch,
and the property values the store parses are refused at put when they mean nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from libstore import MessageIllegalError, MessageRecord, decode_record
from libstore.message import Message
from libstore.record_encoder import RecordEncoder
from libstore.scheduled_message import delivery_time
from libstore.subscription_group import SubscriptionGroupConfig
from libstore.system_topics import QUARANTINE_TOPIC
from services._common.telemetry import metrics_snapshot
from services.client import Admin, OutgoingMessage, Producer
from services.dispatch.pop import QUARANTINE_GROUP, QUARANTINE_REASON
from services.gateway.rocketmq import convert
from services.gateway.rocketmq.pb import Code, service, service_grpc
from services.proto import gateway_grpc, gateway_pb
from services.serve import Suite
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites, v2_receive_request, wait_derived_caught_up

PROPERTY_LIMIT = 32767


@pytest.fixture
def suite_and_loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Suite, InProcessSuites]]:
    suites = InProcessSuites()
    try:
        suite = suites.start(embedded_options(tmp_path_factory.mktemp("poison") / "data"))
        suites.wait_ready(suite)
        yield suite, suites
    finally:
        suites.close()


def _quarantined() -> float:
    return sum(v for _, v in metrics_snapshot().get("mqstore.dispatch.quarantined", []))


def test_a_message_too_big_to_dead_letter_is_parked_and_the_group_moves_on(
    suite_and_loop: tuple[Suite, InProcessSuites],
) -> None:
    suite, suites = suite_and_loop
    run = suites.loop.run
    with Admin(suite.address) as admin:
        admin.create_topic("Bills", 1)
    # Properties just under the limit: the dead-letter copy's three more do not fit.
    filler = "x" * (PROPERTY_LIMIT - 80)
    with Producer(suite.address) as producer:
        assert producer.send_batch([OutgoingMessage("Bills", b"poison", properties={"note": filler})]).all_ok
        assert producer.send("Bills", b"healthy").all_ok
    wait_derived_caught_up(suite)
    assert suite.dispatch_app is not None
    port = suite.dispatch_app.port
    run(port.upsert_group(SubscriptionGroupConfig("payers", retry_max_times=0)))  # one delivery each
    first = run(port.pop("payers", "Bills", -1, max_count=1, invisible_ms=100))
    assert [m.queue_offset for m in first.messages] == [0]
    before = _quarantined()
    time.sleep(0.2)  # its one delivery expires unacked: it is dead
    nxt = run(port.pop("payers", "Bills", -1, max_count=4, invisible_ms=60_000))
    assert [m.queue_offset for m in nxt.messages] == [1]  # the group went on past it
    assert run(port.pop_service.revive()) == 0  # and the revive scan has nothing left to choke on
    assert _quarantined() == before + 1
    wait_derived_caught_up(suite)
    with grpc.insecure_channel(suite.address) as channel:
        pulled = gateway_grpc.GatewayStub(channel).Pull(
            gateway_pb.PullRequest(group="ops", topic=QUARANTINE_TOPIC, queue_id=0, offset=0, max_count=8),
            timeout=5,
        )
    (parked,) = pulled.messages
    assert parked.body == b"poison" and parked.properties[QUARANTINE_GROUP] == "payers"
    assert "properties are" in parked.properties[QUARANTINE_REASON]  # the store's own refusal
    assert parked.properties["DLQ_ORIGIN_TOPIC"] == "Bills" and "note" not in parked.properties


def _record(props: dict[str, str]) -> MessageRecord:
    encoder = RecordEncoder(bytes(8), max_message_size=1 << 20)
    batch = encoder.encode_batch([Message("Bills", b"b", 0, properties=props)], int(time.time() * 1000))
    return decode_record(bytes(batch.buf), check_crc=False)


def test_a_stored_delivery_time_that_is_not_a_number_does_not_break_a_receive() -> None:
    for text in ("²", "١٢٣", "1_000", " 12", "99999999999999999999"):
        message = convert.consumer_message(
            _record({"TIMER_DELIVER_MS": text, "TIMER_OUT_MS": "1"}),
            namespace="",
            receipt_handle="h",
            attempt=1,
            invisible_ms=1000,
        )
        assert not message.system_properties.HasField("delivery_timestamp"), text
    good = convert.consumer_message(
        _record({"TIMER_DELIVER_MS": "1700000000000"}),
        namespace="",
        receipt_handle="h",
        attempt=1,
        invisible_ms=1,
    )
    assert good.system_properties.delivery_timestamp.seconds == 1_700_000_000


def test_delivery_properties_must_be_plain_decimal_numbers_at_put(
    suite_and_loop: tuple[Suite, InProcessSuites],
) -> None:
    now = int(time.time() * 1000)
    for text in ("²", "١٢٣", "1_000", " 12"):  # Python's int() takes some of these; Java's does not
        with pytest.raises(MessageIllegalError, match="decimal"):
            delivery_time({"TIMER_DELIVER_MS": text}, now)
        with pytest.raises(MessageIllegalError, match="decimal"):
            delivery_time({"TIMER_DELAY_SEC": text}, now)
    suite, _ = suite_and_loop
    with Producer(suite.address, encode_records=False) as producer:
        for props in ({"TIMER_DELIVER_MS": "١٢٣"}, {"TIMER_OUT_MS": "1", "TIMER_DELIVER_MS": "²"}):
            with pytest.raises(MessageIllegalError):
                producer.send_batch([OutgoingMessage("Bills", b"crafted", properties=props)])


def test_a_record_a_protocol_cannot_convert_is_moved_aside_not_failing_the_batch(
    suite_and_loop: tuple[Suite, InProcessSuites], monkeypatch: pytest.MonkeyPatch
) -> None:
    suite, _ = suite_and_loop
    real = convert.consumer_message

    def fragile(rec: MessageRecord, **kwargs: object) -> object:
        if rec.body == b"unconvertible":
            raise ValueError("a record this protocol cannot express")
        return real(rec, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(convert, "consumer_message", fragile)
    with Admin(suite.address) as admin:
        admin.create_topic("Mixed", 1)
    with Producer(suite.address) as producer:
        for body in (b"first", b"unconvertible", b"last"):
            assert producer.send("Mixed", body).all_ok
    wait_derived_caught_up(suite)
    replies = _receive(suite.address, "readers", "Mixed", "poison-test")
    with grpc.insecure_channel(suite.address) as channel:
        assert replies[0].status.code == Code.OK
        assert [r.message.body for r in replies if r.HasField("message")] == [b"first", b"last"]
        dead = gateway_grpc.GatewayStub(channel).Pull(
            gateway_pb.PullRequest(
                group="ops", topic="%DLQ%readers", queue_id=0, offset=0, max_count=4, wait_ms=3000
            ),
            timeout=10,
        )
    assert [m.body for m in dead.messages] == [b"unconvertible"]


def test_receipt_handles_cannot_be_made_up_or_used_for_another_group(
    suite_and_loop: tuple[Suite, InProcessSuites],
) -> None:
    """A handle names its message in plain numbers; it used to be enough to write those down to
    ack a message delivered to somebody else. Now only the handle as issued, for the group and
    topic it was issued for, is taken."""
    from libstore.errors import InvalidReceiptHandleError

    suite, suites = suite_and_loop
    run = suites.loop.run
    with Admin(suite.address) as admin:
        admin.create_topic("Signed", 1)
    with Producer(suite.address) as producer:
        for body in (b"one", b"two"):
            assert producer.send("Signed", body).all_ok
    wait_derived_caught_up(suite)
    assert suite.dispatch_app is not None
    port = suite.dispatch_app.port
    (first,) = run(port.pop("g1", "Signed", -1, max_count=1, invisible_ms=60_000)).messages
    (second,) = run(port.pop("g1", "Signed", -1, max_count=1, invisible_ms=60_000)).messages
    handle = first.receipt_handle
    unsigned = handle.rpartition(":")[0]
    guessed = handle.replace(f":{first.queue_offset}:", f":{second.queue_offset}:", 1)  # the other one
    for bad in (unsigned, guessed):
        (err,) = run(port.ack("g1", "Signed", [bad]))
        assert isinstance(err, InvalidReceiptHandleError)
    (err,) = run(port.ack("g2", "Signed", [handle]))  # another group's
    assert isinstance(err, InvalidReceiptHandleError)
    with pytest.raises(InvalidReceiptHandleError):
        run(port.change_invisible("g1", "Signed", unsigned, 1000))
    renewed = run(port.change_invisible("g1", "Signed", handle, 60_000))
    assert run(port.ack("g1", "Signed", [renewed, second.receipt_handle])) == [None, None]


def test_a_consume_queue_unit_pointing_at_another_record_is_not_delivered_as_its_slot(
    suite_and_loop: tuple[Suite, InProcessSuites], caplog: pytest.LogCaptureFixture
) -> None:
    """Defence in depth behind ConsumeQueue recovery (tests/unit/libstore/
    test_torn_consume_queue_unit.py): a unit that points at another record (here: queue offset
    1's unit rewritten to point at offset 0's record, as a torn unit did) must not hand that
    record out under its slot, where a consumer would take it for a new message."""
    suite, _ = suite_and_loop
    with Admin(suite.address) as admin:
        admin.create_topic("Damaged", 1)
    with Producer(suite.address) as producer:
        first, second, third = (producer.send("Damaged", body)[0] for body in (b"zero", b"one!", b"two!"))
    wait_derived_caught_up(suite)
    assert suite.dispatch_app is not None
    queue = suite.dispatch_app.queues.find("Damaged", 0)
    assert queue is not None
    unit = queue.read_units(1, 1)[0]
    assert unit.phy_offset == second.phy_offset and unit.size == first.size  # same-sized records
    path = next(iter(queue.queue.mapped_files)).path
    with open(path, "r+b") as fh:  # what a torn unit looked like: the offset field of another record
        fh.seek(1 * 20)
        fh.write(first.phy_offset.to_bytes(8, "big"))
    replies = _receive(suite.address, "careful", "Damaged", "damaged-test")
    delivered = [
        (r.message.system_properties.queue_offset, r.message.body) for r in replies if r.HasField("message")
    ]
    assert delivered == [(0, b"zero"), (2, b"two!")]
    assert any("points at the record of 0:0" in r.getMessage() for r in caplog.records)
    assert third.queue_offset == 2


def _receive(address: str, group: str, topic: str, client_id: str) -> list[service.ReceiveMessageResponse]:
    """One RocketMQ 5 ReceiveMessage (up to 16 messages, 1 s long poll) as the official client
    sends it; every reply of the stream."""
    request = v2_receive_request(topic, group)
    with grpc.insecure_channel(address) as channel:
        return list(
            service_grpc.MessagingServiceStub(channel).ReceiveMessage(
                request, metadata=[("x-mq-client-id", client_id)], timeout=10
            )
        )
