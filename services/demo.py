"""The libstore demo behind ``mqstore demo`` (and ``make run`` until the services exist).

Appends generated 1 KiB messages across the queues of one topic, shuts the store down, reopens
it (recovery), reads every message back and checks it byte for byte, and reports throughput.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from libstore import CommitLog, FlushDiskType, Message, StoreConfig

DEMO_MARKER = ".mqstore-demo"


@dataclass
class DemoReport:
    """Figures of one demo run (seconds, messages, bytes)."""

    messages: int
    bytes_appended: int
    append_seconds: int | float
    recovery_seconds: float
    read_seconds: float
    verified: int
    segments: int
    recovery_files_scanned: int

    @property
    def append_rate(self) -> float:
        return self.messages / self.append_seconds if self.append_seconds else 0.0

    @property
    def read_rate(self) -> float:
        return self.verified / self.read_seconds if self.read_seconds else 0.0


def payload_pool(size: int, seed: bytes = b"mqstore") -> bytes:
    """Pseudo-random bytes (repeatable): bodies are slices of this pool."""
    import hashlib

    out = bytearray()
    block = seed
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:size])


def body_for(pool: bytes, index: int, body_size: int) -> bytes:
    start = (index * 97) % (len(pool) - body_size)
    return pool[start : start + body_size]


def prepare_dir(path: Path) -> None:
    """Create ``path`` for a fresh demo store; only a folder the demo created itself is wiped."""
    if path.exists() and any(path.iterdir()):
        if not (path / DEMO_MARKER).exists():
            raise SystemExit(f"{path} is not empty and was not created by the demo; choose another --data")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / DEMO_MARKER).touch()


def run_demo(
    data: Path,
    *,
    messages: int = 100_000,
    queues: int = 16,
    body_size: int = 1024,
    batch: int = 256,
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH,
    mapped_file_size: int = 64 * 1024 * 1024,
    progress: Callable[[str, int], None] | None = None,
) -> DemoReport:
    """Run the demo in ``data`` (see module docstring); raises AssertionError if a message differs."""
    prepare_dir(data)
    topic = "DemoTopic"
    config = StoreConfig(
        store_path_root_dir=str(data),
        mapped_file_size_commit_log=mapped_file_size,
        flush_disk_type=flush_disk_type,
        default_topic_queue_nums=queues,
    )
    pool = payload_pool(1 << 20)
    log = CommitLog.open(config)
    appended = 0
    t0 = time.perf_counter()
    try:
        for start in range(0, messages, batch):
            chunk = [
                Message(topic, body_for(pool, i, body_size), i % queues, keys=f"demo-{i}", tags="demo")
                for i in range(start, min(messages, start + batch))
            ]
            for r in log.put_messages(chunk):
                if not r.ok:
                    raise RuntimeError(f"put failed: {r.status.name}")
            appended += len(chunk)
            if progress:
                progress("append", len(chunk))
        append_seconds = time.perf_counter() - t0
        bytes_appended = log.max_offset
    finally:
        log.shutdown()
    t1 = time.perf_counter()
    log = CommitLog.open(config)
    recovery_seconds = time.perf_counter() - t1
    report = log.recovery_report
    assert report is not None
    try:
        t2 = time.perf_counter()
        verified = 0
        for req in log.iter_records(0, check_crc=True):
            rec = log.read_message(req.commit_log_offset, req.msg_size)
            index = int(rec.keys[0].removeprefix("demo-"))
            if rec.body != body_for(pool, index, body_size) or rec.queue_id != index % queues:
                raise AssertionError(f"message {index} at offset {req.commit_log_offset} differs")
            if rec.queue_offset != index // queues:
                raise AssertionError(f"message {index} has queue offset {rec.queue_offset}")
            verified += 1
            if progress and verified % batch == 0:
                progress("read", batch)
        read_seconds = time.perf_counter() - t2
        segments = len(log.queue.mapped_files)
    finally:
        log.shutdown()
    if verified != appended:
        raise AssertionError(f"appended {appended} messages but read back {verified}")
    return DemoReport(
        messages=appended,
        bytes_appended=bytes_appended,
        append_seconds=append_seconds,
        recovery_seconds=recovery_seconds,
        read_seconds=read_seconds,
        verified=verified,
        segments=segments,
        recovery_files_scanned=report.files_scanned,
    )


def default_data_dir() -> Path:
    return Path(os.getcwd()) / "data" / "demo"
