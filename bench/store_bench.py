"""Store benchmarks (issue "libstore: ConsumeQueue, IndexFile, dispatch"):

* dispatch: records/s applied to the ConsumeQueues and the index, replaying a flushed CommitLog
  of 1 KiB messages, next to the append rate of the same messages measured in the same run (one
  producer, batches of 256, ASYNC_FLUSH). Two message shapes: TAGS only (the append benchmark's)
  and keyed (TAGS, one KEYS value and a UNIQ_KEY, as RocketMQ producers send: two index entries
  per message).
* key query: latency of IndexService.query_offsets on a full default-size IndexFile
  (5,000,000 slots, 20,000,000 entries, 420 MB), for keys present and absent.
* pull: latency of MessageStore.get_messages for 32 messages at random offsets, with and
  without a tag filter.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.baseline import BENCH_TAGS, BENCH_TOPIC
from bench.harness import Recorder, Sample, body_at, payload_pool, window_sample
from libstore import CommitLog, Message, StoreConfig
from libstore.index_file import index_hash_of
from libstore.index_service import IndexService
from libstore.tags import java_string_hashes
from services.dispatch.app import DispatchApp
from services.embedded import CommitLogNode, part_config
from services.index.app import IndexApp
from services.message_store import MessageStore

QUEUES = 16
SEGMENT_BYTES = 256 * 1024 * 1024


def _config(root: Path) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=SEGMENT_BYTES,
        default_topic_queue_nums=QUEUES,
    )


def _messages(shape: str, start: int, count: int, pool: bytes) -> list[Message]:
    if shape == "tags":
        return [
            Message(BENCH_TOPIC, body_at(pool, i), i % QUEUES, tags=BENCH_TAGS)
            for i in range(start, start + count)
        ]
    return [
        Message(
            BENCH_TOPIC,
            body_at(pool, i),
            i % QUEUES,
            tags=BENCH_TAGS,
            keys=[f"order-{i}"],
            properties={"UNIQ_KEY": f"7F000001{i:024X}"},
        )
        for i in range(start, start + count)
    ]


@dataclass
class DispatchResult:
    shape: str
    records: int
    append_msgs_per_s: float
    dispatch_records_per_s: float


def dispatch(root: Path, shape: str, records: int) -> DispatchResult:
    """Append ``records`` messages (timed), flush and reopen, then replay them all into fresh
    ConsumeQueues and IndexFiles (timed): the dispatch and index services' TailFollowers over the
    local CommitLog port, as ``mqstore serve`` runs them."""
    pool = payload_pool()
    batches = [_messages(shape, start, min(256, records - start), pool) for start in range(0, records, 256)]
    cfg = _config(root)
    log = CommitLog.open(part_config(cfg, root / "commitlog"))
    t0 = time.perf_counter()
    for batch in batches:
        if not log.put_messages(batch).all_ok:
            raise RuntimeError("append failed")
    append_s = time.perf_counter() - t0
    log.shutdown()  # flushes: the replay below does not compete with writeback
    dispatch_s, dispatched = asyncio.run(_replay(root, cfg))
    if dispatched != records:
        raise RuntimeError(f"dispatched {dispatched} of {records} records")
    return DispatchResult(shape, records, records / append_s, dispatched / dispatch_s)


async def _replay(root: Path, cfg: StoreConfig) -> tuple[float, int]:
    """Seconds for fresh derived services to catch up with the log under ``root``, and the
    records the dispatch service applied."""
    node = await CommitLogNode.open(part_config(cfg, root / "commitlog"))
    try:
        t0 = time.perf_counter()
        apps = [
            DispatchApp(part_config(cfg, root / "dispatch"), node.port),
            IndexApp(part_config(cfg, root / "index"), node.port),
        ]
        for app in apps:
            await app.start()
        for app in apps:
            if not await app.wait_caught_up(600):
                raise RuntimeError(f"{app.name} did not catch up")
        seconds = time.perf_counter() - t0
        assert apps[0].follower is not None
        dispatched = apps[0].follower.records_dispatched
        for app in apps:
            await app.stop()
    finally:
        await node.close()
    return seconds, dispatched


@dataclass
class LatencyResult:
    name: str
    sample: Sample
    note: str


def _time_calls(fn: Callable[[int], object], calls: int) -> Sample:
    rec = Recorder()
    clock = time.perf_counter_ns
    start = clock()
    for i in range(calls):
        t0 = clock()
        fn(i)
        rec.add(t0, clock(), 1)
    return window_sample([rec], start, clock() + 1)


def key_query(
    root: Path, entries: int = 20_000_000, slots: int = 5_000_000, queries: int = 20_000
) -> list[LatencyResult]:
    """Fill one IndexFile of the default size to the brim, then time lookups."""
    index = IndexService(root / "index-full", slots, entries + 1)
    index.load()
    ts0 = 1_700_000_000_000
    chunk = 100_000
    t0 = time.perf_counter()
    f = None
    for start in range(0, entries, chunk):
        keys = [f"{BENCH_TOPIC}#order-{i}" for i in range(start, min(entries, start + chunk))]
        if f is None:
            f = index._new_file(None)
        for i, h in enumerate(java_string_hashes(keys), start):
            if not f.put_hashed(index_hash_of(h), i * 1024, ts0 + i // 1000):
                raise RuntimeError("index file full early")
    fill_s = time.perf_counter() - t0
    assert f is not None and f.is_write_full()
    end = ts0 + entries
    rng = random.Random(7)
    present = [rng.randrange(entries) for _ in range(queries)]
    hit = _time_calls(lambda i: index.query_offsets(BENCH_TOPIC, f"order-{present[i]}", 32, 0, end), queries)
    miss = _time_calls(lambda i: index.query_offsets(BENCH_TOPIC, f"absent-{i}", 32, 0, end), queries)
    for i in present[:200]:
        if i * 1024 not in index.query_offsets(BENCH_TOPIC, f"order-{i}", 32, 0, end):
            raise RuntimeError(f"key order-{i} not found")
    index.shutdown()
    note = f"{entries:,} entries, {slots:,} slots, filled in {fill_s:.0f} s"
    return [
        LatencyResult("key query, key present", hit, note),
        LatencyResult("key query, key absent", miss, note),
    ]


def pull(root: Path, messages: int = 200_000, pulls: int = 20_000) -> list[LatencyResult]:
    """Pulls of 32 messages at random queue offsets from a dispatched store."""
    store = MessageStore.open(_config(root))
    try:
        pool = payload_pool()
        for start in range(0, messages, 256):
            batch = _messages("tags", start, min(256, messages - start), pool)
            for j, m in enumerate(batch):
                m.properties["TAGS"] = "TagB" if (start + j) // QUEUES % 4 == 0 else "TagA"
            store.put_messages(batch)
        if not store.wait_dispatched(600):
            raise RuntimeError("dispatch did not catch up")
        per_queue = messages // QUEUES
        rng = random.Random(11)
        points = [(rng.randrange(QUEUES), rng.randrange(per_queue - 32)) for _ in range(pulls)]

        def one(i: int, tag: str | None) -> None:
            qid, offset = points[i]
            r = store.get_messages("bench", BENCH_TOPIC, qid, offset, 32, tag)
            if not r.found:
                raise RuntimeError(f"pull found nothing: {r.status}")

        plain = _time_calls(lambda i: one(i, None), pulls)
        tagged = _time_calls(lambda i: one(i, "TagB"), pulls)
    finally:
        store.shutdown()
    note = f"{messages:,} messages in {QUEUES} queues"
    return [
        LatencyResult("pull 32 messages", plain, note),
        LatencyResult("pull 32 messages, tag filter (1 in 4 match)", tagged, note),
    ]
