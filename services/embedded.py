"""The store of one process, without its gRPC servers: what ``mqstore serve`` runs and what
:class:`services.message_store.MessageStore` wraps for library users and the crash tests.

:class:`CommitLogNode` is the CommitLog side: the log (load, recover, start), the retry
de-duplication window (restored at start, saved at a clean stop), the LocalCommitLog port and
the HA controller (which settles the broker role and begins an epoch before anything appends).

:class:`EmbeddedStore` adds the derived services' objects on top of a CommitLogNode, wired
through the local port: DispatchApp (ConsumeQueues, consumer offsets, long polling, pop,
timer, transactions) and IndexApp (IndexFiles). Each follows the log through its TailFollower,
exactly as in the split topology, where the same classes follow a remote port.

Folder layout under ``data``: ``commitlog/``, ``dispatch/``, ``index/`` (each one owner's root,
with its own lock and abort marker): the layout of ``mqstore serve --data``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from libstore import BrokerRole, CommitLog, StoreConfig
from services._common.tls import TlsConfig
from services.commitlog.dedup_window import (
    SAVE_INTERVAL_S,
    DedupWindow,
    persist_window,
    restore_window,
    window_path,
    write_window,
)
from services.commitlog.ha import ElectionSettings, HAController
from services.commitlog.local import LocalCommitLog
from services.dispatch.app import DispatchApp
from services.index.app import IndexApp

log = logging.getLogger(__name__)


@dataclass
class CommitLogNode:
    """A started CommitLog with its port and HA controller. Open with :meth:`open`; :meth:`close`.

    While it runs as a master it saves the de-duplication window every SAVE_INTERVAL_S seconds
    (services.commitlog.dedup_window), so a start after a crash scans only what came since; a
    round in which neither the window nor the log moved writes nothing (an idle broker would
    otherwise rewrite a full window, about 14 MB, every round)."""

    commit_log: CommitLog
    port: LocalCommitLog
    ha: HAController
    _saver: asyncio.Task[None] | None = None
    _writing: asyncio.Future[int] | None = None  # the saver's write, running on its thread

    def start_saving_window(self, interval_s: float = SAVE_INTERVAL_S) -> None:
        self._saver = asyncio.get_running_loop().create_task(self._save_window_every(interval_s))

    async def stop_saving_window(self) -> None:
        """Stop the periodic saves, and wait for a write already under way: its thread goes on
        when the saver is cancelled, and the save at close writes the same file (two writers
        of one temporary file could leave a mix of both)."""
        if self._saver is not None:
            self._saver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._saver
            self._saver = None
        if self._writing is not None:
            with contextlib.suppress(Exception):
                await self._writing
            self._writing = None

    async def _save_window_every(self, interval_s: float) -> None:
        saved: tuple[object, ...] = ()  # what the file written last describes
        while True:
            await asyncio.sleep(interval_s)
            log_ = self.commit_log
            dedup, gen = self.port.dedup, log_.generation
            if dedup is None or gen is None or log_.broker_role is BrokerRole.SLAVE:
                continue
            # ``end`` is read on the loop, where appends run, before the copy starts: every
            # keyed record before it is in ``entries`` (as far as the window holds keys).
            log_id, generation, end = gen.log_id, gen.generation, log_.max_offset
            state = (log_id, generation, end, dedup.version)
            if state == saved:
                continue  # nothing put since: the file holds this window already (an idle broker)
            entries = await dedup.snapshot_async()
            now = log_.generation
            if entries is None or now is None or (now.log_id, now.generation) != (log_id, generation):
                continue  # the log was cut meanwhile: the next round saves
            self._writing = asyncio.ensure_future(
                asyncio.to_thread(
                    write_window, window_path(log_.root), entries, log_id, generation, end, release=True
                )
            )
            try:
                await asyncio.shield(self._writing)  # a cancel stops the saver, not the write
            except OSError as exc:
                log.warning("commitlog: the de-duplication window was not saved (%s)", exc)
            else:
                saved = state

    @classmethod
    async def open(
        cls,
        config: StoreConfig,
        *,
        ha_address: str = "",
        commitlog_address: str = "",
        peers: Sequence[str] = (),
        tls: TlsConfig | None = None,
        election: ElectionSettings | None = None,
    ) -> CommitLogNode:
        """Open the CommitLog rooted at ``config.store_path_root_dir`` (load → recover → start),
        restore the de-duplication window and settle the role (with ``election``: join the
        group's election in etcd, services.commitlog.election). Raises what CommitLog.open raises
        (StoreLockedError, StoreIOError, ConfigError; EtcdUnavailableError when etcd cannot be
        reached); on failure nothing is left open and the abort marker stays (the next open still
        recovers abnormally)."""
        commit_log = await asyncio.to_thread(CommitLog.open, config)
        ha: HAController | None = None
        try:
            dedup = DedupWindow()
            loaded, how = await asyncio.to_thread(restore_window, dedup, commit_log)
            log.info("commitlog: %d recent unique keys %s for retry de-duplication", loaded, how)
            port = LocalCommitLog(commit_log, dedup)
            ha = HAController(
                port,
                ha_address=ha_address,
                commitlog_address=commitlog_address,
                peers=peers,
                tls=tls,
                election=election,
            )
            await ha.start()  # settles the role (and the epoch) before any slave connects
        except BaseException:
            if ha is not None:
                await ha.stop()
            await asyncio.to_thread(commit_log.abandon)
            raise
        node = cls(commit_log, port, ha)
        node.start_saving_window()
        return node

    async def close(self) -> None:
        """Stop the HA controller, save the de-duplication window, shut the CommitLog down
        (flush, checkpoint, abort marker removed)."""
        await self.stop_saving_window()
        await self.ha.stop()
        await asyncio.to_thread(self._persist_dedup)
        try:
            await asyncio.to_thread(self.commit_log.shutdown)
        finally:
            self.port.close()  # puts still waiting for the flush are answered, not left hanging

    def _persist_dedup(self) -> None:
        """Keep the retry de-duplication window across a clean restart (no log scan at start)."""
        if self.port.dedup is None:
            return
        self.commit_log.stop_accepting()  # the window must describe the log's final end
        try:
            saved = persist_window(self.port.dedup, self.commit_log)
            log.info("commitlog: %d unique keys saved for the next start", saved)
        except OSError as exc:
            log.warning("commitlog: the de-duplication window was not saved (%s); the next start scans", exc)


def part_config(config: StoreConfig, root: Path) -> StoreConfig:
    """``config`` rooted at ``root`` (one part of the embedded layout)."""
    return config.replace(store_path_root_dir=str(root))


class EmbeddedStore:
    """CommitLogNode + DispatchApp + IndexApp under ``data`` (see module docstring).

    ``config`` gives every setting but the root; ``index=False`` runs without IndexFiles (the
    message index disabled). Open with :meth:`open`; :meth:`close`.
    """

    def __init__(self, node: CommitLogNode, dispatch: DispatchApp, index: IndexApp | None) -> None:
        self.node = node
        self.dispatch = dispatch
        self.index = index

    @property
    def apps(self) -> list[DispatchApp | IndexApp]:
        return [a for a in (self.dispatch, self.index) if a is not None]

    @classmethod
    async def open(
        cls,
        data: Path,
        config: StoreConfig,
        *,
        index: bool = True,
        ha_address: str = "",
        commitlog_address: str = "",
        peers: Sequence[str] = (),
        tls: TlsConfig | None = None,
    ) -> EmbeddedStore:
        """Open the CommitLog, then recover and start the derived services against it. Raises
        what CommitLogNode.open and DerivedStoreApp.start raise; on failure whatever was opened
        is closed again without marking anything clean."""
        data = Path(data)
        node = await CommitLogNode.open(
            part_config(config, data / "commitlog"),
            ha_address=ha_address,
            commitlog_address=commitlog_address,
            peers=peers,
            tls=tls,
        )
        started: list[DispatchApp | IndexApp] = []
        try:
            dispatch = DispatchApp(part_config(config, data / "dispatch"), node.port)
            await dispatch.start()
            started.append(dispatch)
            if node.commit_log.cleaner is not None:  # expiry keeps what the timer still holds
                node.commit_log.cleaner.hold = dispatch.timer.oldest_held_offset
            index_app = None
            if index:
                index_app = IndexApp(part_config(config, data / "index"), node.port)
                await index_app.start()
                started.append(index_app)
        except BaseException:
            for app in reversed(started):
                await app.stop()
            await node.stop_saving_window()
            await node.ha.stop()
            await asyncio.to_thread(node.commit_log.abandon)
            raise
        return cls(node, dispatch, index_app)

    async def wait_caught_up(self, timeout_s: float) -> list[str]:
        """Wait until each derived service applied what the log had confirmed when it started;
        returns the names of those that had not within ``timeout_s``."""
        return [app.name for app in self.apps if not await app.wait_caught_up(timeout_s)]

    async def wait_dispatched(self, offset: int, timeout_s: float) -> bool:
        """Wait until every derived service applied the log up to ``offset`` (True) or
        ``timeout_s`` passes (False)."""
        for app in self.apps:
            follower = app.follower
            if follower is None or not await follower.wait_for(offset, timeout_s):
                return False
        return True

    async def close(self) -> None:
        """Stop the derived services (final flush and checkpoint), then the CommitLog."""
        for app in reversed(self.apps):
            await app.stop()
        await self.node.close()
