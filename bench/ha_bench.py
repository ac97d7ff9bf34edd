"""Replication benchmarks (issue "commitlog-service HA").

A broker group runs as real processes on 127.0.0.1: a master and a slave commitlog service (the
slave streams the master's log over the HA endpoint) and a gateway in front of the master. Load
comes from separate client processes (bench.service_bench.produce: 1 KiB bodies, client-encoded
records, batches in flight), so SYNC_MASTER is measured as a client sees it: a batch is
acknowledged once the slave holds it.

Catch-up: a master store is filled with ``backlog_bytes`` of 1 KiB messages through libstore
(before any service starts), then the master and a slave with an empty log start; the time until
the slave's log end equals the master's is the catch-up time, and the backlog divided by it the
replication throughput.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.harness import payload_pool
from bench.service_bench import QUEUES, REPO, TOPIC, _free_port

BODY = 1024


def _serve(args: list[str], log: Path) -> tuple[subprocess.Popen[bytes], object]:
    out = open(log, "wb")  # noqa: SIM115 - closed by _stop
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "--verbose", "serve", *args], cwd=REPO, stdout=out, stderr=out
    )
    return proc, out


def _stop(procs: list[tuple[subprocess.Popen[bytes], object]]) -> None:
    for proc, out in reversed(procs):
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.close()  # type: ignore[attr-defined]


def _commitlog_args(
    data: Path, listen: str, ha: str, role: str, flush: str, master_ha: str = ""
) -> list[str]:
    args = [
        "--role",
        "commitlog",
        "--data",
        str(data),
        "--listen",
        listen,
        "--ha-listen",
        ha,
        "--broker-role",
        role,
        "--broker-id",
        "1" if role == "SLAVE" else "0",
        "--flush-disk-type",
        flush,
        "--set",
        f"defaultTopicQueueNums={QUEUES}",
    ]
    if master_ha:
        args += ["--ha-master", master_ha]
    return args


async def _ha_state(address: str):
    from services._common.remote import open_channel
    from services.commitlog.client import RemoteCommitLog

    channel = open_channel(address)
    try:
        return await RemoteCommitLog(channel, timeout_s=5).ha_state()
    finally:
        await channel.close()


def ha_state(address: str):
    import asyncio

    return asyncio.run(_ha_state(address))


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what} ({last})")


@contextmanager
def running_group(root: Path, master_role: str, flush: str, *, with_slave: bool = True) -> Iterator[str]:
    """Master (+ slave) commitlog services and a gateway on the master; yields the gateway."""
    addr = {n: f"127.0.0.1:{_free_port()}" for n in ("m", "m-ha", "s", "s-ha", "gw", "none")}
    procs = [_serve(_commitlog_args(root / "m", addr["m"], addr["m-ha"], master_role, flush), root / "m.log")]
    try:
        if with_slave:
            procs.append(
                _serve(
                    _commitlog_args(root / "s", addr["s"], addr["s-ha"], "SLAVE", flush, addr["m-ha"]),
                    root / "s.log",
                )
            )
        gw = [
            "--role",
            "gateway",
            "--data",
            str(root / "gw"),
            "--listen",
            addr["gw"],
            "--commitlog",
            addr["m"],
        ]
        gw += ["--dispatch", addr["none"], "--index", addr["none"]]  # produce only: no reads
        procs.append(_serve(gw, root / "gw.log"))
        from services.client import Admin

        with Admin(addr["gw"]) as admin:
            admin.wait_until_serving(120)
        if with_slave:
            _wait(lambda: any(s.in_sync for s in ha_state(addr["m"]).slaves), 60, "the slave")
        with Admin(addr["gw"]) as admin:
            admin.create_topic(TOPIC, QUEUES)
        yield addr["gw"]
        if with_slave:  # the run is over when the slave holds everything
            _wait(lambda: ha_state(addr["s"]).max_offset == ha_state(addr["m"]).max_offset, 120, "catch-up")
    finally:
        _stop(procs)


@dataclass
class CatchUp:
    """``seconds``: from starting the slave process to holding the master's whole log;
    ``copy_bytes`` / ``copy_seconds``: what was copied between the first and the last look at
    the slave (process start-up excluded)."""

    backlog_bytes: int
    seconds: float
    copy_bytes: int
    copy_seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.copy_bytes / 1e6 / self.copy_seconds if self.copy_seconds else 0.0


def fill(root: Path, backlog_bytes: int) -> int:
    """A master store holding ``backlog_bytes`` of 1 KiB messages (libstore directly)."""
    from libstore import CommitLog, Message, StoreConfig

    config = StoreConfig(store_path_root_dir=str(root), default_topic_queue_nums=QUEUES)
    log = CommitLog.open(config)
    pool = payload_pool(1 << 20)
    try:
        i = 0
        while log.max_offset < backlog_bytes:
            batch = []
            for _ in range(256):
                off = (i * 977) % (len(pool) - BODY)
                batch.append(Message(TOPIC, pool[off : off + BODY], i % QUEUES, tags="TagA"))
                i += 1
            log.put_messages(batch)
        return log.max_offset
    finally:
        log.shutdown()


def catch_up(root: Path, backlog_bytes: int) -> CatchUp:
    """Fill a master with ``backlog_bytes``, start it and an empty slave, time the copy."""
    end = fill(root / "m", backlog_bytes)
    addr = {n: f"127.0.0.1:{_free_port()}" for n in ("m", "m-ha", "s", "s-ha")}
    procs = [
        _serve(
            _commitlog_args(root / "m", addr["m"], addr["m-ha"], "ASYNC_MASTER", "ASYNC_FLUSH"),
            root / "m.log",
        )
    ]
    try:
        _wait(lambda: ha_state(addr["m"]).max_offset == end, 300, "the master")
        t0 = time.perf_counter()
        procs.append(
            _serve(
                _commitlog_args(root / "s", addr["s"], addr["s-ha"], "SLAVE", "ASYNC_FLUSH", addr["m-ha"]),
                root / "s.log",
            )
        )
        first: list[tuple[float, int]] = []

        def done() -> bool:
            offset = ha_state(addr["s"]).max_offset
            if not first:
                first.append((time.perf_counter(), offset))
            return offset == end

        _wait(done, 1800, "the slave to catch up")
        t1 = time.perf_counter()
        return CatchUp(end, t1 - t0, end - first[0][1], t1 - first[0][0])
    finally:
        _stop(procs)
