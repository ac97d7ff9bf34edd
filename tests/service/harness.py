"""Real services for tests: in-process suites on their own event-loop thread, and the split
topology as four ``mqstore serve --role`` processes, all on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from services.client import Admin
from services.serve import ServeOptions, Suite

REPO = Path(__file__).resolve().parents[2]
SMALL_STORE = {
    "mappedFileSizeCommitLog": 8 * 1024 * 1024,
    "maxMessageSize": 1024 * 1024,
    "mappedFileSizeConsumeQueue": 20 * 10_000,
    "maxHashSlotNum": 10_007,
    "maxIndexNum": 40_000,
    "defaultTopicQueueNums": 4,
    "flushIntervalConsumeQueue": 200,
    "flushConsumeQueueThoroughInterval": 1000,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoopThread:
    """An asyncio loop on a daemon thread; ``run(coro)`` executes a coroutine there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout_s: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class InProcessSuites:
    """Suites (one embedded, or several roles wired remotely) running in this process."""

    def __init__(self) -> None:
        self.loop = LoopThread()
        self.suites: list[Suite] = []

    def start(self, options: ServeOptions) -> Suite:
        suite = Suite(options)
        self.loop.run(suite.start())
        self.suites.append(suite)
        return suite

    def wait_ready(self, suite: Suite, timeout_s: float = 60.0) -> None:
        self.loop.run(suite.wait_ready(timeout_s), timeout_s + 5)

    def stop(self, suite: Suite) -> None:
        self.loop.run(suite.stop())
        self.suites.remove(suite)

    def close(self) -> None:
        for suite in reversed(list(self.suites)):
            self.stop(suite)
        self.loop.close()


class ServeProcess:
    """One ``mqstore serve`` process."""

    def __init__(
        self, args: list[str], env: Mapping[str, str] | None = None, log: Path | None = None
    ) -> None:
        self.args = args
        self.log_path = log
        self._log = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed in stop
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "--verbose", "serve", *args],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
            stdout=self._log,
            stderr=self._log,
        )

    def terminate(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        finally:
            self._close_log()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self._close_log()

    def _close_log(self) -> None:
        if not isinstance(self._log, int):
            self._log.close()

    def tail_log(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path else ""


class SplitCluster:
    """commitlog, dispatch, index and gateway as four processes under ``root``."""

    def __init__(
        self, root: Path, store: Mapping[str, Any] | None = None, flush: str = "ASYNC_FLUSH"
    ) -> None:
        self.root = root
        self.ports = {role: free_port() for role in ("commitlog", "dispatch", "index", "gateway")}
        self.store = {**SMALL_STORE, **(store or {})}
        self.flush = flush
        self.procs: dict[str, ServeProcess] = {}

    @property
    def gateway(self) -> str:
        return f"127.0.0.1:{self.ports['gateway']}"

    def address(self, role: str) -> str:
        return f"127.0.0.1:{self.ports[role]}"

    def start(self, role: str) -> ServeProcess:
        args = [
            "--role",
            role,
            "--data",
            str(self.root / role),
            "--listen",
            self.address(role),
            "--commitlog",
            self.address("commitlog"),
            "--dispatch",
            self.address("dispatch"),
            "--index",
            self.address("index"),
            "--flush-disk-type",
            self.flush,
        ]
        for key, value in self.store.items():
            args += ["--set", f"{key}={value}"]
        proc = ServeProcess(args, log=self.root / f"{role}.log")
        self.procs[role] = proc
        return proc

    def start_all(self, timeout_s: float = 60.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for role in ("commitlog", "dispatch", "index", "gateway"):
            self.start(role)
        self.wait_serving(timeout_s)

    def wait_serving(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for role in ("commitlog", "dispatch", "index", "gateway"):
            with Admin(self.address(role)) as admin:
                try:
                    admin.wait_until_serving(max(1.0, deadline - time.monotonic()))
                except Exception as exc:
                    proc = self.procs.get(role)
                    log = proc.tail_log() if proc else ""
                    raise AssertionError(f"{role} is not serving: {exc}\n{log}") from exc

    def stop_all(self) -> None:
        for role in ("gateway", "index", "dispatch", "commitlog"):
            proc = self.procs.pop(role, None)
            if proc is not None:
                proc.terminate()
