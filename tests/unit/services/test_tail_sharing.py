"""The in-process tail decodes each chunk it reads back from the log once: dispatch and index,
following the same log, share the decoded records (services.commitlog.local)."""

from __future__ import annotations

import asyncio

import pytest

import services.commitlog.local as local
from libstore import CommitLog, Message, StoreConfig
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
