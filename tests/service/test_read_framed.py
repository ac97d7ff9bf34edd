"""Pulls whose records pass through as the commitlog framed them (services._common.wire): the
Read RPC answers in its wire form (carried on the call stream or unary, in one call or
several), a remote port re-tags it, and a gateway's Pull/PullMany replies carry the same
records, offsets and statuses as the replies it builds record by record."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from libstore import Message
from libstore.durability import stub_of
from libstore.record_framing import field_header, frame_records, value_starts
from services._common import wire
from services.client import Admin, OutgoingMessage, Producer
from services.proto import commitlog_pb, common_pb, gateway_grpc, gateway_pb
from services.serve import Suite
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites


def test_a_remote_framed_read_matches_a_plain_one_carried_unary_and_in_several_calls(
    suites: InProcessSuites, commitlog_alone: Suite
) -> None:
    from services._common.remote import open_channel
    from services.commitlog.client import CARRIED_MAX_BYTES, RemoteCommitLog
    from services.commitlog.read_plan import DEFAULT_MAX_RANGES

    suite = commitlog_alone

    async def scenario() -> None:
        channel = open_channel(suite.address)
        try:
            log = RemoteCommitLog(channel)
            ranges: list[tuple[int, int]] = []
            for k in range(11):  # more ranges than one Read call asks for (maxReadRangesPerCall)
                batch = [Message("Framed", bytes([k, i]) * (50 + (i * 7) % 250), i % 2) for i in range(100)]
                results = await log.append(batch)
                ranges += zip(results.phy_offsets, results.sizes, strict=True)
            past_end = (ranges[-1][0] + 10 * 1024 * 1024, 500)  # never written: framed empty
            small = [*ranges[:8], past_end]
            assert sum(size for _, size in small) <= CARRIED_MAX_BYTES
            large = [*ranges, past_end, (ranges[3][0], 0)]  # size 0: the whole record
            assert sum(size for _, size in ranges) > CARRIED_MAX_BYTES and len(large) > DEFAULT_MAX_RANGES
            for wanted in (small, large):
                records = await log.read(wanted)
                assert records[-1 if wanted is small else -2] is None
                framed = await log.read_framed(wanted, wire.READ_RECORDS_TAG)
                assert bytes(framed) == frame_records(records, wire.READ_RECORDS_TAG)
                # Re-tagged for a PullResponse; a record missing, so not all there.
                pulled = await log.read_framed(wanted, wire.PULL_RECORDS_TAG)
                assert value_starts(pulled, wire.PULL_RECORDS_TAG, len(wanted)) is None
                reply = gateway_pb.PullResponse.FromString(bytes(pulled))
                assert list(reply.records) == [r or b"" for r in records]
            whole = await log.read_framed(ranges, wire.PULL_RECORDS_TAG)
            found = value_starts(whole, wire.PULL_RECORDS_TAG, len(ranges))
            assert found is not None and found[1] == sum(size for _, size in ranges)
            assert list(gateway_pb.PullResponse.FromString(bytes(whole)).records) == await log.read(ranges)
            # Other callers of Read (any gRPC client) get an ordinary ReadResponse.
            plain = await log.stub.Read(
                commitlog_pb.ReadRequest(offsets=[o for o, _ in small], sizes=[s for _, s in small])
            )
            assert list(plain.records) == [r or b"" for r in await log.read(small)]
            # Ranges a client chose: one whose end passes int64 reads as missing.
            edge = await log.stub.Read(
                commitlog_pb.ReadRequest(offsets=[ranges[0][0], 2**63 - 50], sizes=[ranges[0][1], 100])
            )
            assert list(edge.records) == [(await log.read(ranges[:1]))[0], b""]
        finally:
            await channel.close()

    suites.loop.run(scenario())


def _fill(address: str, topic: str) -> None:
    """300 messages in each of two queues; every seventh transient (its stub in the log, read
    as the whole, larger record)."""
    with Admin(address) as admin:
        admin.create_topic(topic, 2)
    with Producer(address) as producer:
        for k in range(6):
            batch = [(b"%d-%d " % (k, i)) * (1 + (i * 37) % 90) for i in range(50)]
            for q in (0, 1):
                sent = producer.send_batch(
                    [
                        OutgoingMessage(
                            topic,
                            body,
                            queue_id=q,
                            tags=f"t{i % 3}",
                            properties={"DURABILITY": "1"} if i % 7 == 3 else {},
                        )
                        for i, body in enumerate(batch)
                    ]
                )
                assert sent.all_ok


def _pull_both_ways(address: str, topic: str) -> None:
    """Each request twice: "*" (the records pass through) and a filter naming every tag (the
    reply built record by record); the replies must be the same."""
    every = "t0||t1||t2"
    with grpc.insecure_channel(address) as channel:
        stub = gateway_grpc.GatewayStub(channel)
        for offsets in ([0, 0], [37, 120], [299, 300], [290, 5000]):
            queues = [
                gateway_pb.QueuePull(queue_id=q, offset=o, max_count=64)
                for q, o in zip((1, 0), offsets, strict=True)
            ]
            fast, built = (
                stub.PullMany(
                    gateway_pb.PullManyRequest(group="g", topic=topic, queues=queues, tag_expression=t)
                )
                for t in ("*", every)
            )
            assert fast == built and len(fast.results) == 2
            for q, o in ((0, offsets[0]), (1, offsets[1])):
                one_fast, one_built = (
                    stub.Pull(
                        gateway_pb.PullRequest(
                            group="g",
                            topic=topic,
                            queue_id=q,
                            offset=o,
                            max_count=100,
                            raw=True,
                            tag_expression=t,
                        )
                    )
                    for t in ("*", every)
                )
                assert one_fast == one_built
        first = stub.PullMany(
            gateway_pb.PullManyRequest(
                group="g", topic=topic, queues=[gateway_pb.QueuePull(queue_id=0, offset=0, max_count=300)]
            )
        ).results[0]
        assert first.status == common_pb.FOUND and len(first.records) == 300
        assert list(first.queue_offsets) == list(range(300)) and first.next_offset == 300


@pytest.mark.parametrize("topology", ["embedded", "split"])
def test_pull_replies_passed_through_equal_the_ones_built_record_by_record(
    topology: str, request: pytest.FixtureRequest
) -> None:
    if topology == "embedded":
        suite: Suite = request.getfixturevalue("embedded")
        address = suite.address
    else:
        address = request.getfixturevalue("split_in_process")
    _fill(address, "Passed")
    _pull_both_ways(address, "Passed")


def test_a_pull_over_a_transient_message_gone_after_a_restart_is_answered_as_built(
    suites: InProcessSuites, tmp_path: Path
) -> None:
    """Message A is transient and gone after the restart (its record reads as missing, framed
    empty); B, sent after, is transient too, with a body sized so that B's whole record framed
    is exactly as long as A's and B's stubs framed: the total length is then what the stub
    sizes predict, and only walking the framing tells the two apart."""
    topic, transient = "Gone", {"DURABILITY": "1"}

    def started() -> Suite:
        suite = suites.start(embedded_options(tmp_path / "data"))
        suites.wait_ready(suite)
        return suite

    def send(address: str, queue_id: int, body: bytes) -> None:
        with Producer(address) as producer:
            assert producer.send_batch(
                [OutgoingMessage(topic, body, queue_id=queue_id, tags="t", properties=transient)]
            ).all_ok

    suite = started()
    with Admin(suite.address) as admin:
        admin.create_topic(topic, 3)
    send(suite.address, 0, b"a" * 50)
    send(suite.address, 1, b"a" * 50)
    suites.stop(suite)
    suite = started()
    send(suite.address, 2, b"p" * 50)  # learns the sizes
    with grpc.insecure_channel(suite.address) as channel:
        stub = gateway_grpc.GatewayStub(channel)

        def pull(queue_id: int, tags: str) -> gateway_pb.PullResponse:
            return stub.Pull(
                gateway_pb.PullRequest(
                    group="g",
                    topic=topic,
                    queue_id=queue_id,
                    offset=0,
                    max_count=10,
                    raw=True,
                    tag_expression=tags,
                )
            )

        probe = _until_delivered(lambda: pull(2, "*"), 1).records[0]
        stub_size, overhead = len(stub_of(bytearray(probe), 0)), len(probe) - 50
        framed_size = lambda n: len(field_header(wire.PULL_RECORDS_TAG, n)) + n  # noqa: E731
        target = 2 * framed_size(stub_size) - 2
        body = next(n for n in range(1, 10_000) if framed_size(overhead + n) == target)
        send(suite.address, 0, b"b" * body)
        send(suite.address, 1, b"b" * body)
        fast = _until_delivered(lambda: pull(0, "*"), 1)
        assert fast == pull(0, "t")
        assert [len(r) for r in fast.records] == [overhead + body] and fast.skipped == 1
        _until_delivered(lambda: pull(1, "*"), 1)
        queues = [
            gateway_pb.QueuePull(queue_id=0, offset=0, max_count=1),
            gateway_pb.QueuePull(queue_id=1, offset=1, max_count=1),
        ]
        many = [
            stub.PullMany(gateway_pb.PullManyRequest(group="g", topic=topic, queues=queues, tag_expression=t))
            for t in ("*", "t")
        ]
        assert many[0] == many[1] and [list(r.queue_offsets) for r in many[0].results] == [[], [1]]


def _until_delivered(pull: Callable[[], gateway_pb.PullResponse], count: int) -> gateway_pb.PullResponse:
    """``pull`` again until its reply carries ``count`` records (dispatch runs behind the put)."""
    deadline = time.monotonic() + 10
    while True:
        reply = pull()
        if len(reply.records) >= count:
            return reply
        assert time.monotonic() < deadline, reply
        time.sleep(0.05)
