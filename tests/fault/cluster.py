"""FaultCluster: one broker group for the fault loop, as real processes on 127.0.0.1.

Two members ("a", "b"), each a commitlog, a dispatch and an index process sharing the member's
folder (one machine: a power loss takes all three), every process started through
tests/fault/serve.py so a durability recorder keeps the member's shadow files; a gateway over
both members. Each member's replication endpoint is reached through a FaultProxy (it advertises
the proxy's address), so the stream between master and slave can be stalled, slowed or cut.
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from libstore import decode_record
from libstore.log_scanner import scan_buffer
from services.client import Admin
from tests.etcd_cluster import EtcdServers
from tests.fault.powerloss import SLOW_SYNC_FILE, PowerLossReport, lose_power
from tests.fault.proxy import FaultProxy
from tests.service.harness import SMALL_STORE, CommitLogAdmin, ServeProcess, free_port, shared_receipt_key

SEGMENT = 1 << 20
STORE: dict[str, Any] = {
    **SMALL_STORE,
    "autoCreateTopicEnable": "true",  # off by default for split roles; on, as the workload ran before
    "mappedFileSizeCommitLog": SEGMENT,
    "maxMessageSize": 256 * 1024,
    "slaveTimeout": 1500,
    "syncFlushTimeout": 3000,
    "haSendHeartbeatInterval": 1000,
    "haHousekeepingInterval": 6000,
}
SERVICES = ("commitlog", "dispatch", "index")


class Member:
    """One machine of the group: its folder, shadow folder, ports and replication proxy."""

    def __init__(self, root: Path, name: str, index: int) -> None:
        self.name = name
        self.index = index
        self.root = root / name
        self.shadow = root / f"{name}.shadow"
        self.ports = {svc: free_port() for svc in (*SERVICES, "ha", "ha_proxy")}
        self.proxy = FaultProxy(self.ports["ha_proxy"], f"127.0.0.1:{self.ports['ha']}")

    def address(self, svc: str = "commitlog") -> str:
        return f"127.0.0.1:{self.ports[svc]}"


class FaultCluster:
    """See module docstring. ``a`` starts as the SYNC_MASTER, ``b`` as its SLAVE; SYNC_FLUSH.
    With ``election`` the members elect their master through an etcd of their own
    (tests/etcd_cluster.py) instead: SYNC_MASTER whoever wins."""

    def __init__(self, root: Path, store: Mapping[str, Any] | None = None, *, election: bool = False) -> None:
        self.root = root
        self.store = {**STORE, "popReceiptKeyFile": str(shared_receipt_key(root)), **(store or {})}
        self.members = {name: Member(root, name, i) for i, name in enumerate(("a", "b"))}
        self.gateway_port = free_port()
        self.procs: dict[str, ServeProcess] = {}
        self.stopped: set[str] = set()
        self.etcd = EtcdServers(root / "etcd", 1) if election else None

    @property
    def gateway(self) -> str:
        return f"127.0.0.1:{self.gateway_port}"

    def other(self, name: str) -> str:
        return "b" if name == "a" else "a"

    # -- processes ----------------------------------------------------------------------------------
    def _store_args(self) -> list[str]:
        args = ["--flush-disk-type", "SYNC_FLUSH"]
        for key, value in self.store.items():
            args += ["--set", f"{key}={value}"]
        return args

    def _launch(self, key: str, member: Member | None, args: list[str]) -> ServeProcess:
        log = self.root / f"{key}.log"
        if member is None:
            proc = ServeProcess(args, log=log)
        else:
            launcher = ("-m", "tests.fault.serve", str(member.root), str(member.shadow))
            proc = ServeProcess(args, log=log, launcher=launcher)
        self.procs[key] = proc
        return proc

    def start(self, name: str, svc: str) -> None:
        m = self.members[name]
        peer = self.members[self.other(name)]
        if svc == "commitlog":
            args = [
                "--role",
                "commitlog",
                "--data",
                str(m.root / "commitlog"),
                "--listen",
                m.address(),
                "--ha-listen",
                m.address("ha"),
                "--ha-advertise",
                m.address("ha_proxy"),
                "--broker-id",
                str(m.index),
                "--ha-peers",
                peer.address(),
                *self._store_args(),
                "--set",
                f"storeHost={m.address()}",
            ]
            if self.etcd is not None:
                args += ["--election", "etcd", "--etcd", self.etcd.endpoints, "--master-role", "SYNC_MASTER"]
            else:
                args += ["--broker-role", "SYNC_MASTER" if name == "a" else "SLAVE"]
                if name != "a":
                    args += ["--ha-master", peer.address("ha_proxy")]
        else:
            args = [
                "--role",
                svc,
                "--data",
                str(m.root / svc),
                "--listen",
                m.address(svc),
                "--commitlog",
                m.address(),
                *self._store_args(),
            ]
        m.root.mkdir(parents=True, exist_ok=True)
        self._launch(f"{name}-{svc}", m, args)

    def start_gateway(self) -> None:
        args = ["--role", "gateway", "--data", str(self.root / "gateway"), "--listen", self.gateway]
        for svc in SERVICES:
            args += [f"--{svc}", ",".join(m.address(svc) for m in self.members.values())]
        self._launch("gateway", None, [*args, *self._store_args()])

    def start_all(self) -> None:
        if self.etcd is not None:
            self.etcd.start()
        for name in self.members:
            for svc in SERVICES:
                self.start(name, svc)
        self.start_gateway()
        self.wait_serving()

    def address_of(self, key: str) -> str:
        if key == "gateway":
            return self.gateway
        name, _, svc = key.partition("-")
        return self.members[name].address(svc)

    def wait_serving(self, keys: list[str] | None = None, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        for key in keys or list(self.procs):
            with Admin(self.address_of(key)) as admin:
                try:
                    admin.wait_until_serving(max(1.0, deadline - time.monotonic()))
                except Exception as exc:
                    proc = self.procs.get(key)
                    raise AssertionError(
                        f"{key} is not serving: {exc}\n{proc.tail_log() if proc else ''}"
                    ) from exc

    def kill(self, key: str) -> None:
        proc = self.procs.pop(key, None)
        self.stopped.discard(key)
        if proc is not None:
            proc.kill()

    def restart(self, key: str) -> None:
        self.kill(key)
        if key == "gateway":
            self.start_gateway()
        else:
            name, _, svc = key.partition("-")
            self.start(name, svc)

    def pause(self, key: str) -> None:
        self.procs[key].proc.send_signal(signal.SIGSTOP)
        self.stopped.add(key)

    def cont(self, key: str) -> None:
        if key in self.stopped and key in self.procs:
            self.procs[key].proc.send_signal(signal.SIGCONT)
        self.stopped.discard(key)

    def power_loss(self, name: str, rng: random.Random) -> PowerLossReport:
        """SIGKILL every process of the member, then rewind its files (tests/fault/powerloss.py)."""
        for svc in SERVICES:
            self.kill(f"{name}-{svc}")
        m = self.members[name]
        report = lose_power(m.root, m.shadow, rng)
        (m.shadow / SLOW_SYNC_FILE).unlink(missing_ok=True)  # a new disk after the reboot
        return report

    def slow_disk(self, name: str, sync_ms: int) -> None:
        """Make the member's CommitLog fdatasyncs take ``sync_ms`` longer (0: back to normal)."""
        m = self.members[name]
        m.shadow.mkdir(parents=True, exist_ok=True)
        (m.shadow / SLOW_SYNC_FILE).write_text(str(sync_ms))

    def stop_all(self) -> None:
        for key in list(self.procs):
            proc = self.procs.pop(key)
            with contextlib.suppress(subprocess.TimeoutExpired, ProcessLookupError):
                proc.proc.send_signal(signal.SIGCONT)
                proc.terminate(15)
            if proc.proc.poll() is None:
                proc.kill()
        for m in self.members.values():
            m.proxy.close()
        if self.etcd is not None:
            self.etcd.stop()

    # -- roles --------------------------------------------------------------------------------------
    def state(self, name: str) -> Any | None:
        try:
            with CommitLogAdmin(self.members[name].address()) as admin:
                return admin.state()
        except Exception:
            return None

    def master(self, timeout_s: float = 30.0) -> str:
        """The member whose commitlog says it is the master (of the newest epoch)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = {n: self.state(n) for n in self.members}
            masters = [(s.epoch, n) for n, s in states.items() if s is not None and s.broker_role != "SLAVE"]
            if masters:
                return max(masters)[1]
            time.sleep(0.2)
        raise AssertionError("no member is the master")

    def wait_converged(self, timeout_s: float = 60.0) -> int:
        """Wait until the slave holds the master's whole log (producers paused); its end."""
        deadline = time.monotonic() + timeout_s
        last: tuple[Any, Any] = (None, None)
        while time.monotonic() < deadline:
            master = self.master()
            m, s = self.state(master), self.state(self.other(master))
            last = (m, s)
            if (
                m is not None
                and s is not None
                and s.broker_role == "SLAVE"
                and s.master_connected
                and s.epoch == m.epoch  # the handshake with this master's term is done
                and s.max_offset == m.max_offset
            ):
                return int(m.max_offset)
            time.sleep(0.2)
        raise AssertionError(f"replication did not converge: master {last[0]}\nslave {last[1]}")

    def segments(self, name: str) -> Path:
        return self.members[name].root / "commitlog" / "commitlog"


def assert_acked_held(address: str, acked: Mapping[str, Any]) -> dict[tuple[int, int], str]:
    """Every acknowledged message is at its offset in the log at ``address``, with its key and
    queue offset; returns (queue id, queue offset) -> key."""
    keys = sorted(acked)
    placed: dict[tuple[int, int], str] = {}
    with CommitLogAdmin(address) as log:
        for start in range(0, len(keys), 1000):
            chunk = keys[start : start + 1000]
            raws = log.read([(acked[k].phy_offset, acked[k].size) for k in chunk])
            for key, raw in zip(chunk, raws, strict=True):
                assert raw, f"acknowledged message {key} at {acked[key]} is missing on {address}"
                record = decode_record(raw)
                assert record.keys == [key], f"{address} holds {record.keys} where {key} was acknowledged"
                assert record.queue_offset == acked[key].queue_offset
                slot = (record.queue_id, record.queue_offset)
                assert slot not in placed, f"queue offset {slot} given to {placed[slot]} and to {key}"
                placed[slot] = key
    return placed


def assert_same_bytes(first: Path, second: Path, end: int) -> int:
    """The two CommitLogs hold the same bytes in [0, end); returns the bytes compared."""
    compared = 0
    start = 0
    while start < end:
        name = f"{start:020d}"
        a, b = first / name, second / name
        assert a.exists() and b.exists(), f"segment {name} is missing on one side"
        n = min(SEGMENT, end - start)
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read(n) == fb.read(n), f"segment {name} differs before offset {end}"
        compared += n
        start += SEGMENT
    return compared


def queue_offsets_in_log(
    segments: Path, end: int, segment: int = SEGMENT
) -> dict[tuple[str, int], list[int]]:
    """Per (topic, queue id), the queue offsets of the records in ``[0, end)``, in log order
    (``segment``: the CommitLog's segment size)."""
    out: dict[tuple[str, int], list[int]] = {}
    start = 0
    while start < end:
        data = (segments / f"{start:020d}").read_bytes()[: end - start]
        records, _, invalid = scan_buffer(data, start)
        assert invalid is None, f"bytes that are not records at {invalid.commit_log_offset} in {segments}"
        for r in records:
            if r.msg_size:
                out.setdefault((r.topic, r.queue_id), []).append(r.consume_queue_offset)
        start += segment
    return out
