"""The in-process tail decodes each chunk it reads back from the log once: dispatch and index,
following the same log, share the decoded records; batches appended as client-encoded records
are taken as their validation decoded them, from any record on (services.commitlog.local)."""

from __future__ import annotations

import asyncio

import pytest

import services.commitlog.local as local
from libstore import CommitLog, Message, StoreConfig, TopicConfig
from libstore.topic_config import Durability
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


def _fields(r: object) -> tuple[object, ...]:
    return tuple(getattr(r, name) for name in type(r).__slots__)  # type: ignore[attr-defined]


def test_message_form_appends_reach_the_followers_from_their_encoded_bytes(
    store_config: StoreConfig, scans: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch appended from messages (RocketMQ 5 sends, pop-journal records) is kept as the
    bytes its encoder wrote: the first in-process follower decodes those, the second shares
    them, and neither reads the log back; what they take equals a scan of the log, for plain,
    keyed, transient and delayed messages; a batch split by a segment roll is read back."""
    log = CommitLog.open(store_config.replace(default_topic_queue_nums=2))
    reads: list[int] = []
    real_read = CommitLog.read_chunk

    def counting_read(self: CommitLog, offset: int, limit: int, max_bytes: int) -> tuple[bytes, int]:
        reads.append(offset)
        return real_read(self, offset, limit, max_bytes)

    monkeypatch.setattr(CommitLog, "read_chunk", counting_read)
    try:
        log.topic_config.create_or_update(TopicConfig("Tr", 2, 2, durability=Durability.TRANSIENT))
        port = LocalCommitLog(log)
        sends = [
            [Message("T", b"plain", 0)],
            [Message("T", b"keyed", 1, properties={"KEYS": "k1 k2", "TAGS": "tg"})],
            [Message("Tr", b"transient", 0)],
            [Message("T", b"later", 0, properties={"DELAY": "2"})],
            [Message("T", b"%d" % i, i % 2) for i in range(5)],
        ]

        async def run() -> tuple[list[object], list[object], int]:
            a, b = port.tail(0, decoded=True), port.tail(0, decoded=True)
            first = [asyncio.ensure_future(a.__anext__()), asyncio.ensure_future(b.__anext__())]
            await asyncio.sleep(0.01)  # both followers wait at the log's end
            for messages in sends:
                assert (await port.append(messages)).all_ok
            end = log.max_offset
            got: dict[int, list[object]] = {0: [], 1: []}
            for i, (stream, pending) in enumerate(zip((a, b), first, strict=True)):
                chunk = await pending
                while True:
                    got[i] += list(chunk.records or ())
                    if chunk.next_offset >= end:
                        break
                    chunk = await stream.__anext__()
            # Each stream passes its last chunk when asked for the next: then nothing is kept.
            more = [asyncio.ensure_future(a.__anext__()), asyncio.ensure_future(b.__anext__())]
            await asyncio.sleep(0.01)
            assert not port._written and port._written_bytes == 0
            for task in more:
                task.cancel()
            await asyncio.gather(*more, return_exceptions=True)
            await a.aclose()
            await b.aclose()
            return got[0], got[1], end

        first, second, end = asyncio.run(run())
        expected = [r for r in log.scan_records(0, end) if r.msg_size]
        assert [_fields(r) for r in first] == [_fields(r) for r in second] == [_fields(r) for r in expected]
        assert len(first) == 9 and reads == []  # every batch taken from its bytes
        starts = [s for s, _ in scans]
        assert len(starts) == len(set(starts)) == len(sends)  # each decoded once, shared

        # A batch that fills the segment up and rolls (a blank between two records): read back.
        room = log.queue.get_last_mapped_file().remaining
        big = [Message("T", b"y" * 4000, 0) for _ in range(room // 4000 + 2)]

        async def across() -> list[int]:
            stream = port.tail(end, decoded=True)
            pending = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0.01)
            results = await port.append(big)
            assert results.all_ok
            seen: list[int] = []
            chunk = await pending
            while True:
                seen += [r.commit_log_offset for r in chunk.records or ()]
                if chunk.next_offset >= results.next_offset:
                    break
                chunk = await stream.__anext__()
            await stream.aclose()
            assert seen == results.phy_offsets
            return seen

        asyncio.run(across())
        assert reads  # not kept: the tail read it from the log
    finally:
        log.shutdown()


@pytest.mark.parametrize("decoded", [True, False], ids=["decoded", "bytes"])
def test_a_lingering_tail_sends_the_records_of_its_linger_in_one_chunk(
    store_config: StoreConfig, decoded: bool
) -> None:
    """With linger_ms, records appended one at a time within the linger come in one chunk
    (the index's tail); without, each comes alone. A chunk that would be full does not wait."""
    log = CommitLog.open(store_config.replace(default_topic_queue_nums=2))
    try:
        port = LocalCommitLog(log)
        producer = Producer("127.0.0.1:1")

        async def send_one(body: bytes) -> int:
            results = await port.append_records(producer._request([OutgoingMessage("T", body)]).records)
            assert results.all_ok
            return results.phy_offsets[0]

        async def chunks_of(linger_ms: int, sends: int) -> list[list[int]]:
            start = log.max_offset
            got: list[list[int]] = []

            async def read() -> None:  # the follower, reading as chunks come
                stream = port.tail(start, decoded=decoded, linger_ms=linger_ms)
                while sum(map(len, got)) < sends:
                    chunk = await stream.__anext__()
                    if decoded:
                        got.append([r.commit_log_offset for r in chunk.records or ()])
                    elif chunk.data:
                        records = local.scan_buffer(chunk.data, chunk.offset)[0]
                        got.append([r.commit_log_offset for r in records])
                await stream.aclose()

            reader = asyncio.create_task(read())
            await asyncio.sleep(0.05)
            sent = []
            for i in range(sends):  # one record at a time, 20 ms apart
                sent.append(await send_one(b"%d" % i))
                await asyncio.sleep(0.02)
            await asyncio.wait_for(reader, 10)
            assert [o for c in got for o in c] == sent
            return got

        async def run() -> tuple[list[list[int]], list[list[int]], float]:
            alone = await chunks_of(0, 4)
            lingered = await chunks_of(2000, 4)
            # A backlog of at least max_chunk_bytes goes at once, lingering or not.
            start = log.max_offset
            for i in range(40):
                await send_one(b"x" * 1000 + b"%d" % i)
            stream = port.tail(start, max_chunk_bytes=16 * 1024, decoded=decoded, linger_ms=5000)
            t0 = asyncio.get_running_loop().time()
            await asyncio.wait_for(stream.__anext__(), 10)
            waited = asyncio.get_running_loop().time() - t0
            await stream.aclose()
            return alone, lingered, waited

        alone, lingered, waited = asyncio.run(run())
        producer.close()
    finally:
        log.shutdown()
    assert len(alone) == 4  # sent as each was confirmed
    assert len(lingered) == 1  # 4 sends 20 ms apart, well inside the 2 s linger
    assert waited < 2.5  # not the 5 s linger
