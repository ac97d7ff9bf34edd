"""The in-process tail decodes each chunk it reads back from the log once: dispatch and index,
following the same log, share the decoded records (services.commitlog.local)."""

from __future__ import annotations

import asyncio

import pytest

import services.commitlog.local as local
from libstore import CommitLog, Message, StoreConfig
from services.client import OutgoingMessage, Producer
from services.commitlog.local import LocalCommitLog


def test_two_followers_reading_the_same_chunks_decode_them_once(
    store_config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = CommitLog.open(store_config.replace(default_topic_queue_nums=2))
    try:
        for start in range(0, 600, 100):  # appended through CommitLog: no decoded batches kept
            assert log.put_messages(
                [Message("T", b"x" * 1000, i % 2) for i in range(start, start + 100)]
            ).all_ok
        end = log.max_offset
        port = LocalCommitLog(log)
        decoded: list[int] = []
        real = local.scan_buffer

        def counting(data: bytes, offset: int, **kw: object):  # type: ignore[no-untyped-def]
            decoded.append(offset)
            return real(data, offset)

        monkeypatch.setattr(local, "scan_buffer", counting)

        async def follow() -> list[int]:
            seen: list[int] = []
            async for chunk in port.tail(0, max_chunk_bytes=64 * 1024, decoded=True):
                assert chunk.records is not None and not chunk.data
                seen += [r.commit_log_offset for r in chunk.records]
                if chunk.next_offset >= end:
                    return seen

        async def both() -> tuple[list[int], list[int]]:
            return await asyncio.gather(follow(), follow())

        first, second = asyncio.run(both())
        expected = [r.commit_log_offset for r in log.iter_records(0)]
        assert first == second == expected
        assert len(decoded) == len(set(decoded)), "a chunk was decoded twice"
        assert len(decoded) > 5  # 600 KB in 64 KiB chunks
    finally:
        log.shutdown()


def test_a_follower_behind_a_batch_boundary_takes_the_kept_batches(
    store_config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appended as client-encoded records, batches are kept decoded. A follower that starts in
    the middle of one (as one does after a chunk read ended there) takes that batch from its
    record on, and decodes nothing."""
    log = CommitLog.open(store_config.replace(default_topic_queue_nums=2))
    try:
        port = LocalCommitLog(log)
        producer = Producer("127.0.0.1:1")

        async def append() -> list[int]:
            offsets: list[int] = []
            for b in range(6):
                batch = [OutgoingMessage("T", b"%d" % b * 1000) for _ in range(50)]
                results = await port.append_records(producer._request(batch).records)
                assert results.all_ok
                offsets += results.phy_offsets
            return offsets

        offsets = asyncio.run(append())
        producer.close()
        decoded: list[int] = []
        real = local.scan_buffer

        def counting(data: bytes, offset: int, **kw: object):  # type: ignore[no-untyped-def]
            decoded.append(offset)
            return real(data, offset)

        monkeypatch.setattr(local, "scan_buffer", counting)
        start = offsets[75]  # the 26th record of the second batch
        end = log.max_offset

        async def follow() -> list[int]:
            seen: list[int] = []
            async for chunk in port.tail(start, decoded=True):
                assert chunk.records is not None and not chunk.data
                seen += [r.commit_log_offset for r in chunk.records]
                if chunk.next_offset >= end:
                    return seen

        assert asyncio.run(follow()) == offsets[75:]
        assert decoded == []
    finally:
        log.shutdown()


def test_a_chunk_read_stops_at_the_next_kept_batch(
    store_config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes before the kept batches (older ones dropped from the cache) are read back and
    decoded up to the first kept batch, not past it: from there the follower takes batches."""
    log = CommitLog.open(store_config.replace(default_topic_queue_nums=2))
    monkeypatch.setattr(local, "DECODED_BATCHES_KEPT", 2)
    try:
        port = LocalCommitLog(log)
        producer = Producer("127.0.0.1:1")

        async def append() -> list[list[int]]:
            batches = []
            for b in range(5):
                batch = [OutgoingMessage("T", b"%d" % b * 1000) for _ in range(40)]
                results = await port.append_records(producer._request(batch).records)
                assert results.all_ok
                batches.append(results.phy_offsets)
            return batches

        batches = asyncio.run(append())
        producer.close()
        decoded: list[tuple[int, int]] = []
        real = local.scan_buffer

        def counting(data: bytes, offset: int, **kw: object):  # type: ignore[no-untyped-def]
            decoded.append((offset, offset + len(data)))
            return real(data, offset)

        monkeypatch.setattr(local, "scan_buffer", counting)
        end = log.max_offset

        async def follow() -> list[int]:
            seen: list[int] = []
            async for chunk in port.tail(batches[0][10], max_chunk_bytes=1 << 20, decoded=True):
                assert chunk.records is not None
                seen += [r.commit_log_offset for r in chunk.records]
                if chunk.next_offset >= end:
                    return seen

        flat = [o for b in batches for o in b]
        assert asyncio.run(follow()) == flat[10:]
        # batches 0..2 fell out of the cache (2 kept): one read, stopping where batch 3 begins
        assert decoded == [(batches[0][10], batches[3][0])]
    finally:
        log.shutdown()
