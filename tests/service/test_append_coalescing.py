"""Appends to a real commitlog service through RemoteCommitLog (what the split topology's
gateway and dispatch use): many made at once share Append calls (services.commitlog
.append_coalescer), and every caller's results name the records of its own messages."""

from __future__ import annotations

from libstore import Message, MessageIllegalError, PutMessageResults
from libstore.record_codec import decode_record
from services.serve import Suite
from tests.service.harness import InProcessSuites


def test_concurrent_appends_share_calls_and_each_caller_gets_its_own_records(
    suites: InProcessSuites, commitlog_alone: Suite
) -> None:
    import asyncio

    from services._common.remote import open_channel
    from services.commitlog.client import RemoteCommitLog

    suite = commitlog_alone

    async def scenario() -> tuple[list[PutMessageResults], list[list[bytes]], BaseException | None, int]:
        channel = open_channel(suite.address)
        try:
            log = RemoteCommitLog(channel)
            await log.append([Message("Coalesced", b"first", 0)])  # the topic exists from here on
            sends = [
                [Message("Coalesced", b"caller %d message %d" % (c, i), c % 4) for i in range(1 + c % 3)]
                for c in range(60)
            ]
            bad = [Message("Coalesced", b"bad", 99)]  # queue 99 of a topic with fewer: refused
            outcomes = await asyncio.gather(
                *(log.append(s) for s in sends[:30]),
                log.append(bad),
                *(log.append(s) for s in sends[30:]),
                return_exceptions=True,
            )
            refused = outcomes.pop(30)
            results = [r for r in outcomes if isinstance(r, PutMessageResults)]
            assert len(results) == 60, [r for r in outcomes if not isinstance(r, PutMessageResults)]
            stored = [
                [
                    decode_record(raw).body
                    for raw in await log.read(list(zip(r.phy_offsets, r.sizes, strict=True)))
                ]
                for r in results
            ]
            return (
                results,
                stored,
                refused if isinstance(refused, BaseException) else None,
                log.coalescer.coalesced,
            )
        finally:
            await channel.close()

    results, stored, refused, coalesced = suites.loop.run(scenario())
    assert coalesced > 0  # 61 calls at once: those behind the first went together
    for c, (r, bodies) in enumerate(zip(results, stored, strict=True)):
        assert r.all_ok and len(r) == 1 + c % 3
        assert bodies == [b"caller %d message %d" % (c, i) for i in range(1 + c % 3)]
    offsets = [o for r in results for o in r.phy_offsets]
    assert len(set(offsets)) == len(offsets)  # each message stored once
    assert isinstance(refused, MessageIllegalError)  # only the bad message's caller is refused
