"""Pulls whose records pass through as the commitlog framed them (services._common.wire): the
Read RPC answers in its wire form (carried on the call stream or unary, in one call or
several), a remote port re-tags it, and a gateway's Pull/PullMany replies carry the same
records, offsets and statuses as the replies it builds record by record."""

from __future__ import annotations

import grpc
import pytest

from libstore import Message
from libstore.record_framing import frame_records
from services._common import wire
from services.client import Admin, Producer
from services.proto import commitlog_pb, common_pb, gateway_grpc, gateway_pb
from services.serve import Suite
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
                # Re-tagged for a PullResponse: walked, since a record is missing.
                pulled = await log.read_framed(wanted, wire.PULL_RECORDS_TAG)
                assert wire.record_starts([size for _, size in wanted], pulled) is None
                reply = gateway_pb.PullResponse.FromString(bytes(pulled))
                assert list(reply.records) == [r or b"" for r in records]
            whole = await log.read_framed(ranges, wire.PULL_RECORDS_TAG)  # placed by the sizes
            assert wire.record_starts([size for _, size in ranges], whole) is not None
            assert list(gateway_pb.PullResponse.FromString(bytes(whole)).records) == await log.read(ranges)
            # Other callers of Read (any gRPC client) get an ordinary ReadResponse.
            plain = await log.stub.Read(
                commitlog_pb.ReadRequest(offsets=[o for o, _ in small], sizes=[s for _, s in small])
            )
            assert list(plain.records) == [r or b"" for r in await log.read(small)]
        finally:
            await channel.close()

    suites.loop.run(scenario())


def _fill(address: str, topic: str) -> None:
    with Admin(address) as admin:
        admin.create_topic(topic, 2)
    with Producer(address) as producer:
        for k in range(6):
            batch = [(b"%d-%d " % (k, i)) * (1 + (i * 37) % 90) for i in range(50)]
            for q in (0, 1):
                from services.client import OutgoingMessage

                sent = producer.send_batch(
                    [
                        OutgoingMessage(topic, body, queue_id=q, tags=f"t{i % 3}")
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
