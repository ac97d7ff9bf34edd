"""Retention benchmark (issue "Retention"): what a cleanup round costs the producers.

An embedded store is grown in-process to ``segments`` expired CommitLog segments of 4 MiB
(1 KiB messages, 16 queues; their modification times set 100 hours back) plus a fresh one, then
``mqstore serve`` runs on it with ``deleteWhen`` at the current hour, ``deleteFileBatchMax`` at
``segments`` (one round takes them all, ``deleteCommitLogFilesInterval`` 100 ms apart) and
``fileReservedTime`` 72 h. Its first round comes a minute after start, as RocketMQ's. Meanwhile
one client sends batches of 16 messages one at a time, and the gateway's stats are polled every
50 ms: the latencies of sends completed while the log's min offset was moving (the round) are
set against those of the 10 s before it. The dispatch and index services delete their files
below the new min offset in the same window.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness import body_at, payload_pool
from bench.service_bench import REPO, _free_port
from libstore import CommitLog, Message, StoreConfig

TOPIC = "bench-retention"
QUEUES = 16
SEGMENT = 4 * 1024 * 1024
MAX_MESSAGE = 1024 * 1024  # a segment must hold the largest record


@dataclass
class CleanupImpact:
    """Produce latency (ms) before and during a cleanup round, and what the round deleted."""

    segments: int
    round_s: float
    p50_before: float
    p99_before: float
    p50_during: float
    p99_during: float
    sends_during: int

    @property
    def p99_ratio(self) -> float:
        return self.p99_during / self.p99_before if self.p99_before else float("nan")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def grow_expired(data: Path, segments: int) -> None:
    """``segments`` full 4 MiB segments, last modified 100 hours ago, and a fresh one after."""
    config = StoreConfig(
        store_path_root_dir=str(data / "commitlog"),
        default_topic_queue_nums=QUEUES,
        mapped_file_size_commit_log=SEGMENT,
        max_message_size=MAX_MESSAGE,
    )
    log = CommitLog.open(config)
    try:
        pool = payload_pool()
        n = 0
        while log.max_offset < segments * SEGMENT + 1024 * 1024:
            batch = [Message(TOPIC, body_at(pool, i), i % QUEUES, keys=[f"k{i}"]) for i in range(n, n + 512)]
            if not log.put_messages(batch).all_ok:
                raise RuntimeError("append failed")
            n += 512
    finally:
        log.shutdown()
    old = time.time() - 100 * 3600
    for path in sorted((data / "commitlog" / "commitlog").iterdir())[:segments]:
        os.utime(path, (old, old))


def run(data: Path, segments: int = 100, timeout_s: float = 600.0) -> CleanupImpact:
    """Grow, serve, produce and watch one cleanup round (module docstring)."""
    from services.client import Admin, OutgoingMessage, Producer

    grow_expired(data, segments)
    address = f"127.0.0.1:{_free_port()}"
    sets = {
        "defaultTopicQueueNums": QUEUES,
        "mappedFileSizeCommitLog": SEGMENT,
        "maxMessageSize": MAX_MESSAGE,
        "deleteWhen": time.strftime("%H"),
        "deleteFileBatchMax": segments,
        "cleanResourceInterval": 1000,
    }
    args = [sys.executable, "-m", "services.cli", "serve", "--data", str(data), "--listen", address]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    started = time.monotonic()
    with open(data / "serve.log", "ab") as out:
        proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=out)
    try:
        with Admin(address) as admin:
            admin.wait_until_serving(timeout_s)
        sends: list[tuple[float, float]] = []  # (completed at, latency ms)
        stop = threading.Event()

        def produce() -> None:
            pool = payload_pool()
            n = 0
            with Producer(address) as producer:
                while not stop.is_set():
                    batch = [OutgoingMessage(TOPIC, body_at(pool, i)) for i in range(n, n + 16)]
                    t0 = time.perf_counter()
                    if not producer.send_batch(batch).all_ok:
                        raise RuntimeError("produce failed")
                    sends.append((time.monotonic(), (time.perf_counter() - t0) * 1000))
                    n += 16

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        first_move = last_move = 0.0
        with Admin(address) as admin:
            floor = admin.store_stats().commit_log_min_offset
            deadline = started + timeout_s
            while time.monotonic() < deadline:
                now_floor = admin.store_stats().commit_log_min_offset
                if now_floor != floor:
                    floor = now_floor
                    last_move = time.monotonic()
                    first_move = first_move or last_move
                if first_move and floor >= segments * SEGMENT:
                    break
                time.sleep(0.05)
        time.sleep(1.0)
        stop.set()
        producer.join(30)
        if not first_move:
            raise RuntimeError("no cleanup round deleted anything")
        # The round began before the first deletion showed: count from one poll earlier.
        begin, end = first_move - 0.05, last_move + 0.05
        before = [lat for at, lat in sends if begin - 10.0 <= at < begin]
        during = [lat for at, lat in sends if begin <= at <= end]
        return CleanupImpact(
            segments,
            end - begin,
            _pct(before, 50),
            _pct(before, 99),
            _pct(during, 50),
            _pct(during, 99),
            len(during),
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
