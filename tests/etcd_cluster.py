"""A real etcd for the election tests: Debian's ``etcd-server`` (installed by ``make test`` and
``.ci/run``), one to three members as processes on 127.0.0.1, each with its own data folder
under the test's temporary directory. Members can be killed, paused and started again."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import time
from pathlib import Path

import aetcd
import aetcd.exceptions

from tests.service.harness import free_port

# Short Raft timings: a lost etcd leader is replaced within about a second.
HEARTBEAT_MS = 50
ELECTION_MS = 500


def etcd_binary() -> str:
    """The etcd executable. Raises RuntimeError naming the package when it is missing."""
    found = shutil.which("etcd")
    if found is None:
        raise RuntimeError("etcd is not installed: `apt-get install etcd-server` (make test does it)")
    return found


class EtcdServers:
    """``size`` etcd members under ``root`` (see module docstring). Start with :meth:`start`."""

    def __init__(self, root: Path, size: int = 1) -> None:
        self.root = root
        self.names = [f"e{i}" for i in range(size)]
        self.client_ports = {n: free_port() for n in self.names}
        self.peer_ports = {n: free_port() for n in self.names}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def endpoints(self) -> str:
        """``host:port,...`` of every member, for ``--etcd``."""
        return ",".join(f"127.0.0.1:{self.client_ports[n]}" for n in self.names)

    def _args(self, name: str, state: str) -> list[str]:
        cluster = ",".join(f"{n}=http://127.0.0.1:{self.peer_ports[n]}" for n in self.names)
        client = f"http://127.0.0.1:{self.client_ports[name]}"
        peer = f"http://127.0.0.1:{self.peer_ports[name]}"
        return [
            etcd_binary(),
            "--name",
            name,
            "--data-dir",
            str(self.root / name),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            cluster,
            "--initial-cluster-state",
            state,
            "--initial-cluster-token",
            f"mqstore-test-{id(self)}",
            "--heartbeat-interval",
            str(HEARTBEAT_MS),
            "--election-timeout",
            str(ELECTION_MS),
        ]

    def start(self, timeout_s: float = 30.0) -> None:
        """Start every member; wait until the cluster answers writes."""
        self.root.mkdir(parents=True, exist_ok=True)
        for name in self.names:
            self.start_member(name, fresh=True)
        self.wait_healthy(timeout_s)

    def start_member(self, name: str, *, fresh: bool = False) -> None:
        """Start (or start again, keeping its data) member ``name``."""
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs[name] = subprocess.Popen(
            self._args(name, "new" if fresh else "existing"), stdout=log, stderr=log, cwd=self.root
        )
        log.close()

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def pause(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for name in list(self.procs):
            proc = self.procs.pop(name)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Wait until a write through some live member succeeds."""
        deadline = time.monotonic() + timeout_s
        last: BaseException | None = None
        while time.monotonic() < deadline:
            for name in self.procs:
                try:
                    asyncio.run(self._probe(self.client_ports[name]))
                    return
                except (TimeoutError, aetcd.exceptions.ClientError, OSError) as exc:
                    last = exc
            time.sleep(0.2)
        logs = "\n".join((self.root / f"{n}.log").read_text(errors="replace")[-2000:] for n in self.procs)
        raise AssertionError(f"etcd did not become healthy: {last!r}\n{logs}")

    @staticmethod
    async def _probe(port: int) -> None:
        async with aetcd.Client("127.0.0.1", port, timeout=2) as client:
            await client.put(b"/mqstore-test/health", b"ok")

    def read(self, key: str) -> bytes | None:
        """The value of ``key`` (through any live member), None when absent."""

        async def get() -> bytes | None:
            for name in self.procs:
                try:
                    async with aetcd.Client("127.0.0.1", self.client_ports[name], timeout=2) as client:
                        found = await client.get(key.encode())
                        return found.value if found is not None else None
                except (aetcd.exceptions.ClientError, OSError):
                    continue
            raise AssertionError("no etcd member answered")

        return asyncio.run(get())
