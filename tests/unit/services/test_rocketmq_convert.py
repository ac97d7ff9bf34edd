"""RocketMQ 5 (apache.rocketmq.v2) messages to and from the store: the properties the protocol
keeps to itself (WAIT, the trace context), what a send may carry in them, and the replies a
send and an ack get."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from libstore.message import Message
from libstore.message_id import encode_host
from libstore.record_codec import decode_record
from libstore.record_encoder import RecordEncoder
from libstore.results import PutMessageResults
from services.gateway.rocketmq import consume, convert, send
from services.gateway.rocketmq.pb import Code, definition, service

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _v2(user: dict[str, str], trace_context: str | None = None) -> definition.Message:
    sp = definition.SystemProperties(message_id="01ABC", message_type=definition.NORMAL)
    if trace_context is not None:
        sp.trace_context = trace_context
    return definition.Message(
        topic=definition.Resource(name="T"), user_properties=user, system_properties=sp, body=b"x"
    )


def _delivered(user: dict[str, str], trace_context: str | None = None) -> definition.Message:
    """Stored as a send stores it, read back as a consumer gets it."""
    msg, _, _ = convert.store_message(_v2(user, trace_context), peer_ip="127.0.0.1", now_ms=1)
    msg.queue_id = 0
    raw = RecordEncoder(encode_host("127.0.0.1", 10911), 1024).encode_batch([msg], 1).buf
    rec = decode_record(bytes(raw))
    return convert.consumer_message(rec, namespace="", receipt_handle="h", attempt=1, invisible_ms=1000)


def test_wait_is_the_messages_wait_and_stays_out_of_what_consumers_see() -> None:
    msg, _, _ = convert.store_message(_v2({"WAIT": "false", "k": "v"}), peer_ip="127.0.0.1", now_ms=1)
    assert msg.properties["WAIT"] == "false"
    assert dict(_delivered({"WAIT": "false", "k": "v"}).user_properties) == {"k": "v"}


def test_trace_context_travels_as_traceparent_both_ways() -> None:
    msg, _, _ = convert.store_message(_v2({}, TRACE), peer_ip="127.0.0.1", now_ms=1)
    assert msg.properties["traceparent"] == TRACE
    out = _delivered({}, TRACE)
    assert out.system_properties.trace_context == TRACE and "traceparent" not in out.user_properties
    # A user property of that name is the message's trace context when the field is not set.
    assert _delivered({"traceparent": TRACE}).system_properties.trace_context == TRACE


def test_a_trace_context_that_cannot_be_one_is_dropped_not_refused() -> None:
    for bad in ("00-\x01bad", "x" * 600):
        msg, _, _ = convert.store_message(_v2({}, bad), peer_ip="127.0.0.1", now_ms=1)
        assert "traceparent" not in msg.properties


def test_a_delivered_message_fills_a_response_in_place_as_it_would_build_one() -> None:
    """consumer_message(into=...) fills the response's own Message field (no copy of the body
    into the response afterwards); what the consumer gets is the same message either way."""
    from services.gateway.rocketmq.pb import service

    msg, _, _ = convert.store_message(_v2({"k": "v"}, TRACE), peer_ip="10.0.0.9", now_ms=1)
    msg.queue_id = 0
    raw = RecordEncoder(encode_host("127.0.0.1", 10911), 1024).encode_batch([msg], 1).buf
    rec = decode_record(bytes(raw))
    kw = {"namespace": "ns", "receipt_handle": "h", "attempt": 2, "invisible_ms": 1500}
    built = convert.consumer_message(rec, **kw)  # type: ignore[arg-type]
    response = service.ReceiveMessageResponse()
    filled = convert.consumer_message(rec, into=response.message, **kw)  # type: ignore[arg-type]
    assert response.message == built and filled == built
    sp = response.message.system_properties
    assert (sp.message_id, sp.born_host, sp.delivery_attempt, sp.invisible_duration.nanos) == (
        "01ABC",
        "10.0.0.9",
        2,
        500_000_000,
    )
    assert response.message.topic.resource_namespace == "ns" and response.message.body == b"x"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.text(max_size=40), st.integers(-1, 2**62), st.booleans()), min_size=1, max_size=20),
    st.booleans(),
)
def test_a_send_whose_messages_were_all_stored_is_answered_with_protobufs_bytes(
    sent: list[tuple[str, int, bool]], wait_false: bool
) -> None:
    """SendMessage answers an all-PUT_OK send with bytes it encodes itself (send.encode_ok_reply):
    they must be the bytes protobuf gives for the response built the general way (send_reply),
    ids of any text and length (empty too), queue offsets -1 and up, WAIT=false messages among
    them."""
    ids = [mid for mid, _, _ in sent]
    qoffs = [q for _, q, _ in sent]
    n = len(sent)
    results = PutMessageResults(
        n,
        phy_offsets=[1_000 * i for i in range(n)],
        sizes=[100] * n,
        queue_offsets=qoffs,
        store_timestamp=5,
        store_host=encode_host("127.0.0.1", 10911),
        unwaited=frozenset(i for i, (_, _, no_wait) in enumerate(sent) if no_wait and wait_false),
    )
    assert results.all_ok
    messages = [Message("T", b"x", 0) for _ in sent]
    built = send.send_reply(results, messages, ids)
    assert send.encode_ok_reply(ids, qoffs) == built.SerializeToString()
    assert built.status.code == Code.OK and all(e.status.message == "PUT_OK" for e in built.entries)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=40), st.text(max_size=300)), min_size=1, max_size=20))
def test_an_ack_whose_entries_were_all_acked_is_answered_with_protobufs_bytes(
    acked: list[tuple[str, str]],
) -> None:
    """AckMessage answers an ack of entries that all succeeded with bytes it encodes itself
    (consume.encode_acked_reply): the bytes protobuf gives for the reply built the general way
    (consume.ack_reply), ids and receipt handles of any text and length, empty ones too."""
    entries = [service.AckMessageEntry(message_id=m, receipt_handle=h) for m, h in acked]
    built = consume.ack_reply(entries, [None] * len(entries))
    assert consume.encode_acked_reply(entries) == built.SerializeToString()
    assert built.status.code == Code.OK and all(e.status.code == Code.OK for e in built.entries)
