"""Shared benchmark plumbing: timed windows, latency percentiles, payloads, machine facts.

A scenario runs its producers for a warm-up, then a measured window; each put is recorded as
(end time, latency, messages) and only puts that complete inside the window count. Results are
medians/percentiles of that window, never a single timed call (DESIGN: speed lives in bench/,
not in unit tests; these machines are shared and noisy).
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

MESSAGE_SIZE = 1024  # bytes of body per message (OpenMessaging Benchmark's 1 KiB payload size)


def payload_pool(size: int = 1 << 20, seed: bytes = b"mqstore-bench") -> bytes:
    """Repeatable pseudo-random bytes; message bodies are slices of it (incompressible, like
    the OpenMessaging Benchmark's random payload files)."""
    out = bytearray()
    block = seed
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:size])


def body_at(pool: bytes, index: int, size: int = MESSAGE_SIZE) -> bytes:
    start = (index * 977) % (len(pool) - size)
    return pool[start : start + size]


@dataclass
class Sample:
    """Puts that completed inside a window: message count, seconds, per-put latencies (ns)."""

    messages: int
    seconds: float
    latencies_ns: list[int]

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    def mb_per_s(self, record_bytes: int) -> float:
        return self.msgs_per_s * record_bytes / 1e6

    def percentile_ms(self, q: float) -> float:
        if not self.latencies_ns:
            return float("nan")
        ordered = sorted(self.latencies_ns)
        index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
        return ordered[index] / 1e6


class Recorder:
    """One producer's record of puts: appended to without locks, read after the run."""

    __slots__ = ("counts", "ends", "latencies")

    def __init__(self) -> None:
        self.ends: list[int] = []
        self.latencies: list[int] = []
        self.counts: list[int] = []

    def add(self, start_ns: int, end_ns: int, messages: int) -> None:
        self.ends.append(end_ns)
        self.latencies.append(end_ns - start_ns)
        self.counts.append(messages)


def window_sample(recorders: list[Recorder], start_ns: int, end_ns: int) -> Sample:
    """Puts of every recorder that completed within [start_ns, end_ns)."""
    messages = 0
    latencies: list[int] = []
    for rec in recorders:
        for end, lat, n in zip(rec.ends, rec.latencies, rec.counts, strict=True):
            if start_ns <= end < end_ns:
                messages += n
                latencies.append(lat)
    return Sample(messages, (end_ns - start_ns) / 1e9, latencies)


def machine_facts(data_dir: Path) -> dict[str, str]:
    """CPU, cores, kernel, Python, and the filesystem the data folder is on."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fs = ""
    if shutil.which("findmnt"):
        out = subprocess.run(
            ["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", str(data_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        fs = out.stdout.strip()
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "filesystem": fs,
        "date": time.strftime("%Y-%m-%d"),
    }


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) used so far by process ``pid`` and its
    descendants, live or exited and reaped (a process's cutime/cstime hold its waited-for
    children's: Redis's AOF rewrite child, say, still counts after it exits), from
    /proc/<pid>/stat (clock-tick resolution, usually 10 ms); 0.0 for a pid that is gone. The
    difference of two readings is the CPU a server spent in between."""
    children: dict[int, list[int]] = {}
    times: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # pid (comm) state ppid ... utime stime cutime cstime: fields 4 and 14-17; comm may
        # hold spaces
        fields = stat[stat.rindex(")") + 2 :].split()
        proc = int(entry.name)
        children.setdefault(int(fields[1]), []).append(proc)
        times[proc] = sum(int(f) for f in fields[11:15])
    ticks, todo = 0, [pid]
    while todo:
        proc = todo.pop()
        ticks += times.get(proc, 0)
        todo.extend(children.get(proc, ()))
    return ticks / os.sysconf("SC_CLK_TCK")


def process_write_bytes(pid: int) -> float:
    """Bytes process ``pid`` (all its threads) has caused to be written to storage so far:
    ``write_bytes`` of /proc/<pid>/io, which counts page-cache pages as they are dirtied (once a
    page until it is written back), so a log appended through the page cache counts about what
    it appended, before any writeback happened; 0.0 for a pid that is gone, NaN when the file
    cannot be read or lacks the field (not measured, rather than nothing written)."""
    try:
        with open(f"/proc/{pid}/io") as io:
            for line in io:
                if line.startswith("write_bytes:"):
                    return float(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    except OSError:
        return math.nan
    return math.nan


@contextmanager
def scratch_dir(parent: Path, name: str) -> Iterator[Path]:
    """A fresh folder under ``parent`` for one scenario, removed afterwards."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
