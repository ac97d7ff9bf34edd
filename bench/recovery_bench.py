"""Restart benchmarks (issue "the request path": restart time must not grow with the log).

One embedded store grows to each size in turn (1, 4 and 8 GiB of 1 KiB messages by default),
and at each size ``mqstore serve`` is restarted twice, timed from the process start until its
health check says SERVING (it does once dispatch and index have caught up with the log):

* clean: after a SIGTERM (checkpoints written, the de-duplication window saved);
* SIGKILL: after 20,000 more messages were produced through the gateway and the process was
  killed: abnormal recovery from the checkpoint, derived state resuming from its own.

The log is grown in-process through libstore's CommitLog (fast, and not what is measured); a
start that is not timed then lets the derived services catch up with it. Recovery's own figures
(bytes validated, milliseconds) are read from the server's log line ``... recovery: ... N bytes
from offset S (D ms)``.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness import body_at, payload_pool
from bench.service_bench import REPO, _free_port
from libstore import CommitLog, Message, StoreConfig

TOPIC = "bench-restart"
QUEUES = 16
SIZES_GIB = (1, 4, 8)
KILL_MESSAGES = 20_000
_RECOVERY = re.compile(rb"(normal|abnormal) recovery: .* (\d+) bytes from offset (\d+) \(([\d.]+) ms\)")


@dataclass
class RestartResult:
    """One timed restart: the log's size (GiB), how it stopped, seconds until SERVING, and what
    CommitLog recovery validated (GiB) and took (s)."""

    log_gib: float
    kind: str
    serving_s: float
    recovery: str
    scanned_gib: float
    recovery_s: float


def grow_log(data: Path, target_bytes: int) -> int:
    """Append 1 KiB messages (16 queues, a KEYS value each) to the embedded layout's CommitLog
    under ``data`` until it holds ``target_bytes``; returns its size in bytes."""
    config = StoreConfig(store_path_root_dir=str(data / "commitlog"), default_topic_queue_nums=QUEUES)
    log = CommitLog.open(config)
    try:
        pool = payload_pool()
        i = log.max_offset // 1100
        while log.max_offset < target_bytes:
            batch = [Message(TOPIC, body_at(pool, n), n % QUEUES, keys=[f"k{n}"]) for n in range(i, i + 512)]
            if not log.put_messages(batch).all_ok:
                raise RuntimeError("append failed")
            i += 512
        return log.max_offset
    finally:
        log.shutdown()


class Server:
    """``mqstore serve`` on ``data`` (its log appended to ``data/serve.log``)."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.address = f"127.0.0.1:{_free_port()}"
        self._log = open(data / "serve.log", "ab")  # noqa: SIM115 - closed in stop()
        self._log_from = self._log.tell()
        self.started = time.perf_counter()
        args = [sys.executable, "-m", "services.cli", "--verbose", "serve", "--data", str(data)]
        args += ["--listen", self.address, "--set", f"defaultTopicQueueNums={QUEUES}"]
        self.proc = subprocess.Popen(args, cwd=REPO, stdout=self._log, stderr=self._log)

    def wait_serving(self, timeout_s: float) -> float:
        """Seconds from the process start until SERVING. The port is probed every 10 ms first,
        so gRPC's reconnect back-off (seconds, once a connection was refused) is not measured."""
        from services.client import Admin

        host, _, port = self.address.rpartition(":")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"mqstore serve did not listen on {self.address}") from None
                time.sleep(0.01)
        with Admin(self.address) as admin:
            admin.wait_until_serving(timeout_s)
        return time.perf_counter() - self.started

    def recovery(self) -> tuple[str, int, float]:
        """(normal|abnormal, bytes validated, seconds) from this start's recovery log line."""
        self._log.flush()
        text = (self.data / "serve.log").read_bytes()[self._log_from :]
        m = _RECOVERY.search(text)
        if m is None:
            raise RuntimeError("no recovery line in the server's log")
        return m.group(1).decode(), int(m.group(2)), float(m.group(4)) / 1000

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)
        try:
            self.proc.wait(300)
        finally:
            self._log.close()


def _produce(address: str, count: int) -> None:
    from services.client import OutgoingMessage, Producer

    pool = payload_pool()
    with Producer(address) as producer:
        for start in range(0, count, 500):
            batch = [
                OutgoingMessage(TOPIC, body_at(pool, n), keys=[f"x{n}"]) for n in range(start, start + 500)
            ]
            if not producer.send_batch(batch).all_ok:
                raise RuntimeError("produce failed")


def restarts(data: Path, gib: float, timeout_s: float = 1800.0) -> list[RestartResult]:
    """Grow the store under ``data`` to ``gib`` GiB, let it catch up, then time a clean and a
    SIGKILL restart (see module docstring)."""
    size = grow_log(data, int(gib * 1024**3))
    warm = Server(data)
    warm.wait_serving(timeout_s)  # dispatch and index catch up with the grown log (not timed)
    warm.stop()
    out = []
    clean = Server(data)
    seconds = clean.wait_serving(timeout_s)
    kind, scanned, rec_s = clean.recovery()
    out.append(RestartResult(size / 1024**3, "clean", seconds, kind, scanned / 1024**3, rec_s))
    _produce(clean.address, KILL_MESSAGES)
    time.sleep(0.5)
    clean.stop(signal.SIGKILL)
    killed = Server(data)
    seconds = killed.wait_serving(timeout_s)
    kind, scanned, rec_s = killed.recovery()
    out.append(RestartResult(size / 1024**3, "SIGKILL", seconds, kind, scanned / 1024**3, rec_s))
    killed.stop()
    return out


def run(data: Path, sizes: tuple[float, ...] = SIZES_GIB) -> list[RestartResult]:
    """:func:`restarts` at each size in turn, on one growing store under ``data``."""
    data.mkdir(parents=True, exist_ok=True)
    results: list[RestartResult] = []
    for gib in sizes:
        results += restarts(data, gib)
    return results


if __name__ == "__main__":  # python -m bench.recovery_bench DIR [GiB ...]
    sizes = tuple(float(x) for x in sys.argv[2:]) or SIZES_GIB
    for r in run(Path(sys.argv[1]), sizes):
        print(r, flush=True)
