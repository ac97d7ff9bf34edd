"""Raw baselines measured in the same run as the store, so results read as ratios.

* ``encode_copy``: RocketMQ records (same body and properties as the store benchmark) packed with
  one ``struct`` call, CRC'd and copied into a page-cache-resident file mapping, 256 per batch,
  with no validation, no locks and no offsets table: the ceiling of a pure-Python append path.
* ``fdatasync``: append one 1 KiB record with ``pwrite`` and ``fdatasync`` it, in a loop: the
  ceiling of SYNC_FLUSH for one producer with batches of 1 (one flush per put, no grouping).
* ``sequential write``: ``fio`` (1 MiB writes, end fsync) when installed, else ``dd`` with
  ``conv=fdatasync``: the disk's streaming bandwidth.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

from bench.harness import MESSAGE_SIZE, Recorder, Sample, body_at, payload_pool, window_sample
from libstore.message_id import encode_host
from libstore.record_codec import MESSAGE_MAGIC_CODE, properties_to_bytes

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover
    from zlib import crc32

BENCH_TOPIC = "BenchTopic"
BENCH_TAGS = "TagA"
_HEADER = struct.Struct(">iiiiiqqiq8sq8siqi")


def record_size() -> int:
    """Bytes of one benchmark record: header, 1 KiB body, topic, TAGS property."""
    props = properties_to_bytes({"TAGS": BENCH_TAGS})
    return _HEADER.size + MESSAGE_SIZE + 1 + len(BENCH_TOPIC) + 2 + len(props)


def encode_copy(data_dir: Path, seconds: float, batch: int = 256) -> Sample:
    """Records/s of raw encode + copy into a file mapping (see module docstring)."""
    pool = payload_pool()
    host = encode_host("127.0.0.1", 10911)
    topic = bytes((len(BENCH_TOPIC),)) + BENCH_TOPIC.encode()
    props = properties_to_bytes({"TAGS": BENCH_TAGS})
    tail = topic + struct.pack(">h", len(props)) + props
    bodies = [body_at(pool, i) for i in range(4096)]
    size = 256 * 1024 * 1024
    path = data_dir / "encode-copy.dat"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        mm = mmap.mmap(fd, size)
        mm[:] = bytes(size)  # resident, like a preloaded segment
        rec = Recorder()
        pack = _HEADER.pack
        total = _HEADER.size + MESSAGE_SIZE + len(tail)
        phy = 0
        i = 0
        start = time.perf_counter_ns()
        warm_end = start + 300_000_000
        end = warm_end + int(seconds * 1e9)
        now = start
        while now < end:
            t0 = now
            parts: list[bytes] = []
            add = parts.append
            for _ in range(batch):
                body = bodies[i & 4095]
                add(
                    pack(
                        total,
                        MESSAGE_MAGIC_CODE,
                        crc32(body) & 0x7FFFFFFF,
                        i & 15,
                        0,
                        i >> 4,
                        phy,
                        0,
                        1,
                        host,
                        2,
                        host,
                        0,
                        0,
                        MESSAGE_SIZE,
                    )
                )
                add(body)
                add(tail)
                phy += total
                i += 1
            buf = b"".join(parts)
            pos = phy % (size - len(buf))
            mm[pos : pos + len(buf)] = buf
            now = time.perf_counter_ns()
            rec.add(t0, now, batch)
        mm.close()
        return window_sample([rec], warm_end, end)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def fdatasync_loop(data_dir: Path, seconds: float) -> Sample:
    """Puts/s of pwrite(1 KiB record) + fdatasync, one at a time (see module docstring)."""
    path = data_dir / "fdatasync.dat"
    record = bytes(record_size())
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, 64 * 1024 * 1024)
        os.fsync(fd)
        rec = Recorder()
        pos = 0
        start = time.perf_counter_ns()
        warm_end = start + 300_000_000
        end = warm_end + int(seconds * 1e9)
        now = start
        while now < end:
            t0 = now
            os.pwrite(fd, record, pos)
            os.fdatasync(fd)
            pos = (pos + len(record)) % (60 * 1024 * 1024)
            now = time.perf_counter_ns()
            rec.add(t0, now, 1)
        return window_sample([rec], warm_end, end)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def sequential_write(data_dir: Path, size_mb: int = 512) -> tuple[str, float]:
    """(tool, MB/s) of a streaming write that ends with a flush: fio if present, else dd."""
    path = data_dir / "seqwrite.dat"
    try:
        if shutil.which("fio"):
            out = subprocess.run(
                [
                    "fio",
                    "--name=seqwrite",
                    f"--filename={path}",
                    "--rw=write",
                    "--bs=1M",
                    f"--size={size_mb}M",
                    "--end_fsync=1",
                    "--output-format=json",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            job = json.loads(out.stdout)["jobs"][0]["write"]
            return "fio", job["bw_bytes"] / 1e6
        if shutil.which("dd"):
            t0 = time.perf_counter()
            subprocess.run(
                [
                    "dd",
                    "if=/dev/zero",
                    f"of={path}",
                    "bs=1M",
                    f"count={size_mb}",
                    "conv=fdatasync",
                    "status=none",
                ],
                check=True,
            )
            return "dd", size_mb * 1024 * 1024 / (time.perf_counter() - t0) / 1e6
        return "none", float("nan")
    finally:
        path.unlink(missing_ok=True)
