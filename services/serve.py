"""``mqstore serve``: run the embedded suite or one role of the split topology.

Embedded (the default): the four services in one process, wired through their local ports; the
gateway listens on 127.0.0.1:8081; data under ``<data>/commitlog``, ``<data>/dispatch`` and
``<data>/index``. Split: ``--role commitlog|dispatch|index|gateway`` runs one service on its own
address, reaching the others over gRPC (remote ports); each role's data lives directly in
``--data``. The same classes run in both.

Start order: the CommitLog recovers before anything listens; dispatch and index recover against
its bounds and report SERVING once they caught up with what it had confirmed at their start.
Stop (SIGTERM/SIGINT): stop taking calls (health NOT_SERVING, then the servers drain), stop the
derived services (final flush and checkpoint), shut the CommitLog down (flush, checkpoint,
abort file removed) so the next start takes normal recovery.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from libstore import CommitLog, StoreConfig
from services._common.remote import open_channel
from services._common.server import GrpcServer, start_grpc_server
from services._common.telemetry import configure_tracing
from services.commitlog.dedup_window import DedupWindow
from services.commitlog.local import LocalCommitLog
from services.commitlog.servicer import CommitLogServicer
from services.commitlog.servicer import add_to_server as add_commitlog
from services.dispatch.app import DispatchApp
from services.dispatch.servicer import DispatchServicer
from services.dispatch.servicer import add_to_server as add_dispatch
from services.gateway.servicer import GatewayServicer
from services.gateway.servicer import add_to_server as add_gateway
from services.index.app import IndexApp
from services.index.servicer import IndexServicer
from services.index.servicer import add_to_server as add_index
from services.ports import CommitLogPort

log = logging.getLogger(__name__)

ROLES = ("embedded", "commitlog", "dispatch", "index", "gateway")
DEFAULT_ADDRESSES = {
    "embedded": "127.0.0.1:8081",
    "gateway": "127.0.0.1:8081",
    "commitlog": "127.0.0.1:10911",
    "dispatch": "127.0.0.1:10921",
    "index": "127.0.0.1:10931",
}


@dataclass
class ServeOptions:
    """What ``mqstore serve`` was asked to run. ``store`` holds StoreConfig keys (CLI flags and
    MQSTORE_* variables, already merged); ``conf_file`` a broker.conf-style file."""

    role: str = "embedded"
    data_dir: Path = Path("data")
    listen: str = ""
    commitlog: str = DEFAULT_ADDRESSES["commitlog"]
    dispatch: str = DEFAULT_ADDRESSES["dispatch"]
    index: str = DEFAULT_ADDRESSES["index"]
    store: Mapping[str, Any] = field(default_factory=dict)
    conf_file: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    catch_up_timeout_s: float = 600.0

    @property
    def address(self) -> str:
        return self.listen or DEFAULT_ADDRESSES[self.role]


def store_config(options: ServeOptions, root: Path) -> StoreConfig:
    """The StoreConfig of one service rooted at ``root`` (file < env < flags)."""
    overrides = dict(options.store)
    overrides["storePathRootDir"] = str(root)
    return StoreConfig.from_sources(conf_file=options.conf_file, env=options.env, overrides=overrides)


class Suite:
    """The services of one process (see module docstring). ``await start()``; ``await stop()``."""

    def __init__(self, options: ServeOptions) -> None:
        if options.role not in ROLES:
            raise ValueError(f"unknown role {options.role!r}; choose one of {', '.join(ROLES)}")
        self.options = options
        self.commit_log: CommitLog | None = None
        self.commitlog_port: LocalCommitLog | None = None
        self.dispatch_app: DispatchApp | None = None
        self.index_app: IndexApp | None = None
        self.server: GrpcServer | None = None
        self._channels: list[grpc.aio.Channel] = []
        self._ready_task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        assert self.server is not None
        return self.server.address

    async def start(self) -> None:
        role = self.options.role
        configure_tracing("mqstore" if role == "embedded" else f"mqstore-{role}")
        data = Path(self.options.data_dir)
        if role == "embedded":
            commitlog = await self._start_commitlog(data / "commitlog")
            await self._start_derived(data, commitlog, embedded=True)
            assert self.dispatch_app is not None and self.index_app is not None
            gateway = GatewayServicer(
                commitlog,
                self.dispatch_app.port,
                self.index_app.port,
                endpoints=[self.options.address],
                max_pull_batch=self.dispatch_app.config.max_pull_batch_size,
                max_hold_ms=self.dispatch_app.config.long_polling_hold_time,
            )
            self.server = await start_grpc_server(self.options.address, lambda s: add_gateway(gateway, s))
            self._ready_task = asyncio.create_task(self._serving_when_caught_up())
        elif role == "commitlog":
            port = await self._start_commitlog(data)
            self.server = await start_grpc_server(
                self.options.address, lambda s: add_commitlog(CommitLogServicer(port), s)
            )
            await self.server.set_serving(True)
        elif role in ("dispatch", "index"):
            remote = self._remote_commitlog()
            await self._start_derived(data, remote, embedded=False)
            if role == "dispatch":
                assert self.dispatch_app is not None
                servicer = DispatchServicer(self.dispatch_app.port)
                self.server = await start_grpc_server(
                    self.options.address, lambda s: add_dispatch(servicer, s)
                )
            else:
                assert self.index_app is not None
                index_servicer = IndexServicer(self.index_app.port)
                self.server = await start_grpc_server(
                    self.options.address, lambda s: add_index(index_servicer, s)
                )
            self._ready_task = asyncio.create_task(self._serving_when_caught_up())
        else:  # gateway
            from services.dispatch.client import RemoteDispatch
            from services.index.client import RemoteIndex

            dispatch_channel = open_channel(self.options.dispatch)
            index_channel = open_channel(self.options.index)
            self._channels += [dispatch_channel, index_channel]
            cfg = store_config(self.options, data)
            gateway = GatewayServicer(
                self._remote_commitlog(),
                RemoteDispatch(dispatch_channel),
                RemoteIndex(index_channel),
                endpoints=[self.options.address],
                max_pull_batch=cfg.max_pull_batch_size,
                max_hold_ms=cfg.long_polling_hold_time,
            )
            self.server = await start_grpc_server(self.options.address, lambda s: add_gateway(gateway, s))
            await self.server.set_serving(True)
        log.info("mqstore %s serving on %s", role, self.server.address)

    def _remote_commitlog(self) -> CommitLogPort:
        from services.commitlog.client import RemoteCommitLog

        channel = open_channel(self.options.commitlog)
        self._channels.append(channel)
        return RemoteCommitLog(channel)

    async def _start_commitlog(self, root: Path) -> LocalCommitLog:
        config = store_config(self.options, root)
        self.commit_log = await asyncio.to_thread(CommitLog.open, config)
        dedup = DedupWindow()
        loaded = await asyncio.to_thread(dedup.prefill, self.commit_log)
        log.info("commitlog: %d recent unique keys loaded for retry de-duplication", loaded)
        self.commitlog_port = LocalCommitLog(self.commit_log, dedup)
        return self.commitlog_port

    async def _start_derived(self, data: Path, commitlog: CommitLogPort, *, embedded: bool) -> None:
        role = self.options.role
        if embedded or role == "dispatch":
            self.dispatch_app = DispatchApp(
                store_config(self.options, data / "dispatch" if embedded else data), commitlog
            )
            await self.dispatch_app.start()
        if embedded or role == "index":
            self.index_app = IndexApp(
                store_config(self.options, data / "index" if embedded else data), commitlog
            )
            await self.index_app.start()

    async def _serving_when_caught_up(self) -> None:
        timeout = self.options.catch_up_timeout_s
        for app in (self.dispatch_app, self.index_app):
            if app is not None and not await app.wait_caught_up(timeout):
                log.warning("%s has not caught up with the CommitLog after %.0f s", app.name, timeout)
        if self.server is not None:
            await self.server.set_serving(True)

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until the suite reports SERVING (derived services caught up)."""
        if self._ready_task is not None:
            await asyncio.wait_for(asyncio.shield(self._ready_task), timeout_s)

    async def stop(self, grace_s: float = 5.0) -> None:
        if self._ready_task is not None:
            self._ready_task.cancel()
        if self.server is not None:
            await self.server.stop(grace_s)
        for app in (self.index_app, self.dispatch_app):
            if app is not None:
                await app.stop()
        for channel in self._channels:
            await channel.close()
        if self.commit_log is not None:
            await asyncio.to_thread(self.commit_log.shutdown)


async def serve_forever(options: ServeOptions, ready: asyncio.Event | None = None) -> None:
    """Start a Suite, run until SIGTERM or SIGINT, then stop it gracefully."""
    suite = Suite(options)
    await suite.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        log.info("mqstore %s stopping", options.role)
        await suite.stop()
