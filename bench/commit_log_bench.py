"""CommitLog append benchmark: 1 KiB messages, batches of 1/16/256, ASYNC_FLUSH and SYNC_FLUSH,
1 and 32 concurrent producers (issue "libstore: the CommitLog").

Producers are threads calling the blocking ``CommitLog.put_messages`` (the library API), or, in
the ``asyncio`` rows, tasks on one event loop that append and then await the group-commit
future (how the gRPC services drive the store). Messages are built once per producer and
reused, so the numbers are the store's cost, not the client's. Each message: 1 KiB
incompressible body, one TAGS property, queue ids spread over 16 queues; 256 MiB segments, so
the longer runs roll files (with background pre-allocation) as a real broker does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

from bench.baseline import BENCH_TAGS, BENCH_TOPIC
from bench.harness import Recorder, Sample, body_at, payload_pool, window_sample
from libstore import CommitLog, FlushDiskType, Message, PutMessageStatus, StoreConfig

QUEUES = 16
SEGMENT_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Scenario:
    """One cell of the matrix."""

    flush: FlushDiskType
    producers: int
    batch: int
    mode: str = "threads"  # "threads" (blocking put_messages) or "asyncio" (append + await flush)
    transient_pool: bool = False

    @property
    def name(self) -> str:
        extra = " +pool" if self.transient_pool else ""
        return f"{self.flush.value} p={self.producers} b={self.batch} {self.mode}{extra}"


@dataclass
class Result:
    """A scenario's measured window and what the store did during the run."""

    scenario: Scenario
    sample: Sample
    failed_puts: int
    group_commit_flushes_per_s: float


def default_matrix() -> list[Scenario]:
    out = [
        Scenario(flush, producers, batch)
        for flush in (FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH)
        for producers in (1, 32)
        for batch in (1, 16, 256)
    ]
    out += [Scenario(FlushDiskType.SYNC_FLUSH, 32, batch, mode="asyncio") for batch in (1, 16, 256)]
    out += [Scenario(FlushDiskType.ASYNC_FLUSH, 1, batch, transient_pool=True) for batch in (16, 256)]
    out += [Scenario(FlushDiskType.SYNC_FLUSH, 32, 16, transient_pool=True)]
    return out


def _config(root: str, sc: Scenario) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=SEGMENT_BYTES,
        flush_disk_type=sc.flush,
        default_topic_queue_nums=QUEUES,
        transient_store_pool_enable=sc.transient_pool,
        transient_store_pool_size=3,
    )


def _batches(sc: Scenario) -> list[list[Message]]:
    pool = payload_pool()
    return [
        [
            Message(BENCH_TOPIC, body_at(pool, k * sc.batch + i), (k + i) % QUEUES, tags=BENCH_TAGS)
            for i in range(sc.batch)
        ]
        for k in range(sc.producers)
    ]


def run(sc: Scenario, root: str, seconds: float, warmup_s: float = 0.5) -> Result:
    """Run ``sc`` against a fresh store in ``root``: warm up, then measure ``seconds``."""
    log = CommitLog.open(_config(root, sc))
    try:
        batches = _batches(sc)
        recorders = [Recorder() for _ in batches]
        if sc.mode == "asyncio":
            failed, window = asyncio.run(_run_asyncio(log, batches, recorders, warmup_s, seconds))
        else:
            failed, window = _run_threads(log, batches, recorders, warmup_s, seconds)
        flushes = log.group_commit_flushes
    finally:
        log.shutdown()
    start, end = window
    sample = window_sample(recorders, start, end)
    return Result(sc, sample, failed, flushes / ((end - start) / 1e9 + warmup_s))


def _run_threads(
    log: CommitLog,
    batches: list[list[Message]],
    recorders: list[Recorder],
    warmup_s: float,
    seconds: float,
) -> tuple[int, tuple[int, int]]:
    stop = threading.Event()
    failed = [0] * len(batches)

    def produce(k: int) -> None:
        msgs = batches[k]
        rec = recorders[k]
        clock = time.perf_counter_ns
        while not stop.is_set():
            t0 = clock()
            results = log.put_messages(msgs)
            t1 = clock()
            if not results.all_ok:
                failed[k] += 1
            rec.add(t0, t1, len(msgs))

    threads = [threading.Thread(target=produce, args=(k,), daemon=True) for k in range(len(batches))]
    for t in threads:
        t.start()
    time.sleep(warmup_s)
    start = time.perf_counter_ns()
    time.sleep(seconds)
    end = time.perf_counter_ns()
    stop.set()
    for t in threads:
        t.join()
    return sum(failed), (start, end)


async def _run_asyncio(
    log: CommitLog,
    batches: list[list[Message]],
    recorders: list[Recorder],
    warmup_s: float,
    seconds: float,
) -> tuple[int, tuple[int, int]]:
    stop = False
    failed = 0

    async def produce(k: int) -> None:
        nonlocal failed
        msgs = batches[k]
        rec = recorders[k]
        clock = time.perf_counter_ns
        while not stop:
            t0 = clock()
            appended = log.append_messages(msgs)
            future = log.submit_flush_request(appended.wait_offset) if appended.wait_offset >= 0 else None
            status = await asyncio.wrap_future(future) if future else PutMessageStatus.PUT_OK
            t1 = clock()
            if status is not PutMessageStatus.PUT_OK or appended.results.appended != len(msgs):
                failed += 1
            rec.add(t0, t1, len(msgs))
            await asyncio.sleep(0)  # ASYNC_FLUSH never awaits: let the other producers run

    tasks = [asyncio.create_task(produce(k)) for k in range(len(batches))]
    await asyncio.sleep(warmup_s)
    start = time.perf_counter_ns()
    await asyncio.sleep(seconds)
    end = time.perf_counter_ns()
    stop = True
    await asyncio.gather(*tasks)
    return failed, (start, end)
