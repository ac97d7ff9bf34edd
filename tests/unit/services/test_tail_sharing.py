"""The in-process tail decodes each chunk it reads back from the log once: dispatch and index,
following the same log, share the decoded records; batches appended as client-encoded records
are taken as their validation decoded them, from any record on (services.commitlog.local)."""

from __future__ import annotations

import asyncio

import pytest

import services.commitlog.local as local
from libstore import CommitLog, Message, StoreConfig
from services.client import OutgoingMessage, Producer
from services.commitlog.local import LocalCommitLog


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(start, end) of every chunk the tail decodes from log bytes."""
    seen: list[tuple[int, int]] = []
    real = local.scan_buffer

    def counting(data: bytes, offset: int, **kw: object):  # type: ignore[no-untyped-def]
        seen.append((offset, offset + len(data)))
        return real(data, offset)

    monkeypatch.setattr(local, "scan_buffer", counting)
    return seen


async def _follow(port: LocalCommitLog, start: int, end: int, max_chunk_bytes: int = 0) -> list[int]:
    """The CommitLog offsets of the records a decoded tail from ``start`` gives up to ``end``."""
    seen: list[int] = []
    async for chunk in port.tail(start, max_chunk_bytes=max_chunk_bytes, decoded=True):
        assert chunk.records is not None and not chunk.data
        seen += [r.commit_log_offset for r in chunk.records]
        if chunk.next_offset >= end:
            return seen
    raise AssertionError("the tail ended")


def _append_batches(port: LocalCommitLog, batches: int, size: int) -> list[list[int]]:
    """Append ``batches`` client-encoded batches of ``size`` 1 KB messages; their offsets."""
    producer = Producer("127.0.0.1:1")

    async def append() -> list[list[int]]:
        out = []
        for b in range(batches):
            batch = [OutgoingMessage("T", b"%d" % b * 1000) for _ in range(size)]
            results = await port.append_records(producer._request(batch).records)
            assert results.all_ok
            out.append(results.phy_offsets)
        return out

    try:
        return asyncio.run(append())
    finally:
        producer.close()


def test_two_followers_reading_the_same_chunks_decode_them_once(
    store_config: StoreConfig, scans: list[tuple[int, int]]
) -> None:
    log = CommitLog.open(store_config.replace(default_topic_queue_nums=2))
    try:
        for start in range(0, 600, 100):  # appended through CommitLog: no decoded batches kept
            assert log.put_messages(
                [Message("T", b"x" * 1000, i % 2) for i in range(start, start + 100)]
            ).all_ok
        end = log.max_offset
        port = LocalCommitLog(log)

        async def both() -> tuple[list[int], list[int]]:
            return await asyncio.gather(_follow(port, 0, end, 64 * 1024), _follow(port, 0, end, 64 * 1024))

        first, second = asyncio.run(both())
        expected = [r.commit_log_offset for r in log.iter_records(0)]
        assert first == second == expected
        starts = [s for s, _ in scans]
        assert len(starts) == len(set(starts)), "a chunk was decoded twice"
        assert len(starts) > 5  # 600 KB in 64 KiB chunks
    finally:
        log.shutdown()


def test_a_follower_behind_a_batch_boundary_takes_the_kept_batches(
    store_config: StoreConfig, scans: list[tuple[int, int]]
) -> None:
    """A follower that starts in the middle of a kept batch (as one does after a chunk read
    ended there) takes that batch from its record on, and decodes nothing."""
    log = CommitLog.open(store_config.replace(default_topic_queue_nums=2))
    try:
        port = LocalCommitLog(log)
        offsets = [o for batch in _append_batches(port, 6, 50) for o in batch]
        start = offsets[75]  # the 26th record of the second batch
        assert asyncio.run(_follow(port, start, log.max_offset)) == offsets[75:]
        assert scans == []
    finally:
        log.shutdown()


def test_a_chunk_read_stops_at_the_next_kept_batch(
    store_config: StoreConfig, scans: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes before the kept batches (older ones dropped from the cache) are read back and
    decoded up to the first kept batch, not past it: from there the follower takes batches."""
    log = CommitLog.open(store_config.replace(default_topic_queue_nums=2))
    monkeypatch.setattr(local, "DECODED_BATCHES_KEPT", 2)
    try:
        port = LocalCommitLog(log)
        batches = _append_batches(port, 5, 40)
        flat = [o for b in batches for o in b]
        assert asyncio.run(_follow(port, batches[0][10], log.max_offset, 1 << 20)) == flat[10:]
        # batches 0..2 fell out of the cache (2 kept): one read, stopping where batch 3 begins
        assert scans == [(batches[0][10], batches[3][0])]
    finally:
        log.shutdown()
