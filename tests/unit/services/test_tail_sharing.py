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


def test_what_every_in_process_follower_has_taken_leaves_the_caches(
    store_config: StoreConfig, scans: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept batches and chunks read back stay only until every decoded tail has passed them:
    held longer, their requests are young objects each garbage collection walks."""
    log = CommitLog.open(store_config.replace(default_topic_queue_nums=2))
    monkeypatch.setattr(local, "DECODED_BATCHES_KEPT", 3)
    try:
        port = LocalCommitLog(log)
        batches = _append_batches(port, 6, 20)  # the first three fell out: read back as a chunk
        flat = [o for b in batches for o in b]

        async def run() -> None:
            a, b = port.tail(0, decoded=True), port.tail(0, decoded=True)
            got: dict[str, list[int]] = {"a": [], "b": []}

            async def step(name: str) -> None:  # take the next chunk (the one before is passed)
                chunk = await (a if name == "a" else b).__anext__()
                got[name] += [r.commit_log_offset for r in chunk.records or ()]

            await step("a")
            await step("b")  # both took the chunk read back (bytes of batches 0..2)
            await step("a")  # a passed it and took the kept batches 3..5; b has not passed it
            assert len(port._chunks) == 1 and len(port._decoded) == 3
            await step("b")  # now both have: the chunk leaves
            assert len(port._chunks) == 0 and len(port._decoded) == 3
            waiting = [asyncio.create_task(step(name)) for name in ("a", "b")]
            await asyncio.sleep(0.05)  # both passed the kept batches and wait for the log to grow
            assert len(port._decoded) == 0 and port._decoded.records == 0
            assert got["a"] == got["b"] == flat
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            await a.aclose()
            await b.aclose()
            assert port._readers == {}

        asyncio.run(run())
        assert scans == [(0, batches[3][0])]  # read back once, shared
    finally:
        log.shutdown()


def test_an_idle_tail_reports_where_the_log_stands_every_heartbeat(store_config: StoreConfig) -> None:
    """A tail with nothing to send yields an empty chunk each heartbeat (the follower learns
    the confirm offset); an append in between is sent at once and the heartbeats go on."""
    log = CommitLog.open(store_config.replace(default_topic_queue_nums=2))
    try:
        port = LocalCommitLog(log)

        async def run() -> None:
            loop = asyncio.get_running_loop()
            stream = port.tail(0, heartbeat_ms=40, decoded=True)
            started = loop.time()
            beats = [await stream.__anext__() for _ in range(3)]
            assert all(c.records is None and c.next_offset == c.offset == 0 for c in beats)
            assert loop.time() - started >= 3 * 0.04 * 0.9  # one per heartbeat, not sooner
            request = Producer("127.0.0.1:1")._request([OutgoingMessage("T", b"x")])
            results = await port.append_records(request.records)
            data = await asyncio.wait_for(stream.__anext__(), 5)
            assert [r.commit_log_offset for r in data.records or ()] == results.phy_offsets
            beat = await asyncio.wait_for(stream.__anext__(), 5)
            assert beat.records is None and beat.offset == beat.next_offset == log.max_offset
            await stream.aclose()

        asyncio.run(run())
    finally:
        log.shutdown()
