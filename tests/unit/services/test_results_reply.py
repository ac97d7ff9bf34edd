"""convert.encode_results_reply: a Produce/Append reply encoded by libstore._codec's
encode_put_results, byte for byte what protobuf gives for the same results (results_to_pb in a
ProduceResponse), read as those results by both reply types."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libstore import PutMessageResults, PutMessageStatus, record_codec
from libstore.message_id import encode_host
from services._common import convert
from services.proto import commitlog_pb, gateway_pb

EXT = record_codec._ext
INT64 = st.integers(-(2**63), 2**63 - 1)
HOSTS = st.sampled_from([b"", encode_host("192.168.1.2", 10911), encode_host("2001:db8::7", 10911)])


@st.composite
def put_results(draw: st.DrawFn) -> PutMessageResults:
    """Results as the store makes them, and the corners the wire allows: failures part way
    (fewer sizes than results), offsets of -1 and at int64's ends, statuses that are not OK,
    WAIT=false indexes."""
    count = draw(st.integers(0, 40))
    appended = draw(st.integers(0, count))
    phys = draw(st.lists(INT64, min_size=appended, max_size=appended))
    sizes = draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=appended, max_size=count))
    qoffs = draw(st.lists(INT64, min_size=appended, max_size=appended))
    out = PutMessageResults(
        count,
        phy_offsets=phys,
        sizes=sizes,
        queue_offsets=qoffs,
        store_timestamp=draw(INT64),
        store_host=draw(HOSTS),
        failed_status=draw(st.sampled_from(list(PutMessageStatus))),
        unwaited=frozenset(draw(st.lists(st.integers(0, max(count - 1, 0)), max_size=count))),
    )
    out.status = draw(st.sampled_from(list(PutMessageStatus)))
    return out


def test_the_c_encoder_is_built() -> None:
    """Without it the comparison below would hold protobuf to itself."""
    assert EXT is not None and hasattr(EXT, "encode_put_results")


@settings(max_examples=300, deadline=None)
@given(put_results())
def test_the_c_encoding_is_protobufs_byte_for_byte(results: PutMessageResults) -> None:
    encoded = convert.encode_results_reply(results)
    assert encoded == convert._encode_results_pb(results)
    expected = convert.results_to_pb(results)
    for reply_type in (gateway_pb.ProduceResponse, commitlog_pb.AppendResponse):
        assert reply_type.FromString(encoded).results == expected


def test_a_single_message_reply_carries_its_message_id() -> None:
    host = encode_host("10.0.0.5", 10911)
    results = PutMessageResults(
        1,
        phy_offsets=[123_456],
        sizes=[1_135],
        queue_offsets=[7],
        store_timestamp=1_764_400_000_000,
        store_host=host,
    )
    reply = gateway_pb.ProduceResponse.FromString(convert.encode_results_reply(results))
    assert list(reply.results.msg_ids) == [(host + (123_456).to_bytes(8, "big")).hex().upper()]
    assert (reply.results.count, reply.results.appended, list(reply.results.sizes)) == (1, 1, [1_135])


def test_bad_input_raises_instead_of_encoding_garbage() -> None:
    assert EXT is not None
    with pytest.raises(ValueError, match="8 or 20 bytes"):
        EXT.encode_put_results(1, 1, 0, 0, [1], [2], [3], 4, b"abc", [])
    with pytest.raises(TypeError, match="must be ints"):
        EXT.encode_put_results(1, 1, 0, 0, [1.5], [2], [3], 4, b"", [])
    with pytest.raises(OverflowError):
        EXT.encode_put_results(1, 1, 0, 0, [2**64], [2], [3], 4, b"", [])
    with pytest.raises(TypeError):
        EXT.encode_put_results(1, 1, 0, 0, (1,), [2], [3], 4, b"", [])


def test_without_the_c_module_protobuf_encodes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """MQSTORE_PURE_PYTHON or no compiler: the reply still carries every field."""
    results = PutMessageResults(2, phy_offsets=[5, 9], sizes=[4, 4], queue_offsets=[0, 1], store_timestamp=3)
    monkeypatch.setattr(convert, "native", lambda: None)
    reply = gateway_pb.ProduceResponse.FromString(convert.encode_results_reply(results)).results
    assert (reply.count, reply.appended, list(reply.phy_offsets), list(reply.sizes)) == (2, 2, [5, 9], [4, 4])
    assert (list(reply.queue_offsets), reply.store_timestamp, list(reply.msg_ids)) == ([0, 1], 3, [])
