"""HAService: the master's side of classic master/slave replication (spec sheet §7).

Transport-free: the commitlog service streams the bytes (its own gRPC protocol) and reports what
each slave acknowledged here; this class keeps, per slave, the acknowledged offset, and answers
the SYNC_MASTER question "may this put be acknowledged?" (RocketMQ's GroupTransferService):

* :meth:`submit_replica_request` — 4.9 semantics: with fewer in-sync slaves than required (none
  connected, or each behind by ``haMaxGapNotInSync`` bytes or more) the put fails at once with
  SLAVE_NOT_AVAILABLE; otherwise a future resolves PUT_OK once enough slaves acknowledged an
  offset at or past the put's end (the caller waits ``slaveTimeout`` ms, then
  FLUSH_SLAVE_TIMEOUT). ``inSyncReplicas`` counts the master (RocketMQ 5's meaning); SYNC_MASTER
  always requires at least one slave.
* with a SyncStateSet (:meth:`set_sync_state_set`, an elected master: services.commitlog.election)
  a put instead waits for every slave of the set (RocketMQ 5's ``allAckInSyncStateSet``), and
  fails at once with SLAVE_NOT_AVAILABLE while the set holds fewer slaves than required: whoever
  the set names holds every acknowledged message, which is what makes its members electable.
* :attr:`replicated_offset` — monotonic: the highest offset that the required number of slaves
  hold (with a SyncStateSet: every slave of the set). Under SYNC_MASTER the CommitLog's confirm
  offset never passes it, so consumers never see bytes that losing the master could erase.
* :meth:`lag` per slave: bytes behind, and ms since the master wrote the first byte the slave
  lacks.

A slave that has not reported for ``haHousekeepingInterval`` ms is dropped (:meth:`expire`).
Thread-safe: acks arrive on the service's event loop, puts on any thread.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from libstore.results import PutMessageStatus

log = logging.getLogger(__name__)

_PURGE_AT = 4096
_APPEND_SAMPLES = 65536


@dataclass
class SlaveLag:
    """One slave as the master sees it (bytes, ms)."""

    address: str
    broker_id: int
    ack_offset: int
    lag_bytes: int
    lag_ms: int
    in_sync: bool
    connected_ms: int


class HAConnection:
    """A connected slave: ``ack_offset`` is -1 until its first report; ``sent_offset`` is where
    the bytes sent to it end (its acks count no further: a slave cannot hold what it was not
    sent, whatever its own log says)."""

    def __init__(self, address: str, broker_id: int, sent_offset: int = 0) -> None:
        self.address = address
        self.broker_id = broker_id
        self.sent_offset = sent_offset
        self.ack_offset = -1
        self.last_report = time.monotonic()
        self.connected_at = time.monotonic()
        self.closed = False

    def __repr__(self) -> str:
        return f"HAConnection({self.address}, id={self.broker_id}, ack={self.ack_offset})"


class HAService:
    """Replica bookkeeping of one master (see module docstring).

    ``max_offset`` returns the master's CommitLog end; ``on_replicated`` is called with the new
    :attr:`replicated_offset` whenever it moves (the CommitLog wakes its tail readers).
    ``in_sync_replicas`` counts the master; ``max_gap`` is haMaxGapNotInSync (bytes);
    ``housekeeping_ms`` is haHousekeepingInterval.
    """

    def __init__(
        self,
        max_offset: Callable[[], int],
        *,
        in_sync_replicas: int = 1,
        max_gap: int = 256 * 1024 * 1024,
        housekeeping_ms: int = 20_000,
        on_replicated: Callable[[int], None] | None = None,
    ) -> None:
        self._max_offset = max_offset
        self.required_slaves = max(in_sync_replicas - 1, 1)
        self.max_gap = max_gap
        self.housekeeping_ms = housekeeping_ms
        self._on_replicated = on_replicated
        self._lock = threading.Lock()
        self._connections: list[HAConnection] = []
        self._waiters: list[tuple[int, int, Future[PutMessageStatus]]] = []
        self._seq = itertools.count()
        self._replicated = 0
        # Broker ids of the slaves every put waits for (None: any ``required_slaves`` of them).
        self._sync_state_set: frozenset[int] | None = None
        # (end offset, monotonic time) of recent appends, for the lag in ms.
        self._appends: collections.deque[tuple[int, float]] = collections.deque(maxlen=_APPEND_SAMPLES)

    # -- connections ----------------------------------------------------------------------------
    def register(self, address: str, broker_id: int, start_offset: int = 0) -> HAConnection:
        """A slave whose stream starts at ``start_offset`` (what it holds, as the handshake found)."""
        conn = HAConnection(address, broker_id, start_offset)
        with self._lock:
            self._connections.append(conn)
        log.info("slave %s (broker id %d) connected", address, broker_id)
        return conn

    def unregister(self, conn: HAConnection) -> None:
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)
            conn.closed = True
        log.info("slave %s disconnected (acked %d)", conn.address, conn.ack_offset)

    @property
    def connections(self) -> list[HAConnection]:
        with self._lock:
            return list(self._connections)

    def expire(self, now: float | None = None) -> list[HAConnection]:
        """Drop slaves silent for ``housekeeping_ms``; return them (their streams should close)."""
        now = time.monotonic() if now is None else now
        limit = self.housekeeping_ms / 1000.0
        with self._lock:
            dead = [c for c in self._connections if now - c.last_report > limit]
        for conn in dead:
            log.warning("slave %s silent for %.0f s: dropped", conn.address, now - conn.last_report)
            self.unregister(conn)
        return dead

    # -- acknowledgements ---------------------------------------------------------------------
    def report(self, conn: HAConnection, ack_offset: int) -> None:
        """The slave behind ``conn`` holds the log up to ``ack_offset`` (bytes; counted no
        further than ``conn.sent_offset``)."""
        ack_offset = min(ack_offset, conn.sent_offset)
        with self._lock:
            conn.last_report = time.monotonic()
            if ack_offset <= conn.ack_offset or conn.closed:
                return
            conn.ack_offset = ack_offset
            moved_to, done = self._advance_locked()
            if moved_to >= 0:
                floor = min((c.ack_offset for c in self._connections), default=moved_to)
                appends = self._appends
                while appends and appends[0][0] <= floor:
                    appends.popleft()
        self._release(moved_to, done)

    def _advance_locked(self) -> tuple[int, list[Future[PutMessageStatus]]]:
        """Move :attr:`replicated_offset` to what the acks now reach (never back); returns the
        new offset (-1: unchanged) and the waiters it covers (lock held)."""
        reached = self._reached_locked()
        if reached <= self._replicated:
            return -1, []
        self._replicated = reached
        done = []
        waiters = self._waiters
        while waiters and waiters[0][0] <= reached:
            done.append(heapq.heappop(waiters)[2])
        return reached, done

    def _release(self, moved_to: int, done: list[Future[PutMessageStatus]]) -> None:
        """Outside the lock: resolve ``done`` PUT_OK and report ``moved_to`` (when >= 0)."""
        for fut in done:
            if not fut.done():
                fut.set_result(PutMessageStatus.PUT_OK)
        if moved_to >= 0 and self._on_replicated is not None:
            self._on_replicated(moved_to)

    def _reached_locked(self) -> int:
        """The offset the acks reach: the ``required_slaves``-th highest ack, or with a
        SyncStateSet the lowest ack among its slaves (-1 while one of them has not reported,
        or while it holds fewer slaves than required)."""
        members = self._sync_state_set
        if members is None:
            acks = sorted((c.ack_offset for c in self._connections), reverse=True)
            k = self.required_slaves
            return acks[k - 1] if len(acks) >= k else -1
        if len(members) < self.required_slaves:
            return -1
        best: dict[int, int] = {}
        for c in self._connections:
            if c.broker_id in members:
                best[c.broker_id] = max(best.get(c.broker_id, -1), c.ack_offset)
        return min((best.get(b, -1) for b in members), default=-1)

    # -- SyncStateSet -----------------------------------------------------------------------------
    @property
    def sync_state_set(self) -> frozenset[int] | None:
        """Broker ids of the slaves a SYNC_MASTER put waits for (None: no set, any
        ``required_slaves`` acks do)."""
        return self._sync_state_set

    def set_sync_state_set(self, broker_ids: frozenset[int] | None) -> None:
        """Wait for every slave in ``broker_ids`` from now on (None: back to any
        ``required_slaves``). Whoever publishes the set must add a slave here before publishing
        it and remove it here only after (services.commitlog.election): the published set then
        never names a slave that missed an acknowledged put."""
        with self._lock:
            self._sync_state_set = None if broker_ids is None else frozenset(broker_ids)
            moved_to, done = self._advance_locked()
        self._release(moved_to, done)

    @property
    def replicated_offset(self) -> int:
        """Highest offset held by the required number of slaves (monotonic)."""
        return self._replicated

    def reset_replicated_offset(self, offset: int) -> None:
        """Start from ``offset`` (a new term, or the persisted confirm offset at start)."""
        with self._lock:
            self._replicated = offset

    # -- SYNC_MASTER ------------------------------------------------------------------------------
    def in_sync_count(self, master_max: int | None = None) -> int:
        """Slaves that reported and are behind by less than ``max_gap`` bytes (with a
        SyncStateSet: the slaves it names, each of which every put waits for)."""
        members = self._sync_state_set
        if members is not None:
            return len(members)
        top = self._max_offset() if master_max is None else master_max
        with self._lock:
            return sum(
                1 for c in self._connections if c.ack_offset >= 0 and top - c.ack_offset < self.max_gap
            )

    def submit_replica_request(self, next_offset: int) -> Future[PutMessageStatus]:
        """A future for a put ending at ``next_offset``: already SLAVE_NOT_AVAILABLE when too few
        slaves are in sync, already PUT_OK when they hold it, else resolved PUT_OK by the
        report that gets it there. The caller applies ``slaveTimeout`` (FLUSH_SLAVE_TIMEOUT)."""
        fut: Future[PutMessageStatus] = Future()
        if self.in_sync_count() < self.required_slaves:
            fut.set_result(PutMessageStatus.SLAVE_NOT_AVAILABLE)
            return fut
        with self._lock:
            if self._replicated >= next_offset:
                fut.set_result(PutMessageStatus.PUT_OK)
                return fut
            heapq.heappush(self._waiters, (next_offset, next(self._seq), fut))
            if len(self._waiters) > _PURGE_AT:
                self._waiters = [w for w in self._waiters if not w[2].done()]
                heapq.heapify(self._waiters)
        return fut

    def fail_waiters(self, status: PutMessageStatus) -> int:
        """Resolve every pending request with ``status`` (the store stopped being the master)."""
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_result(status)
        return len(waiters)

    # -- lag ----------------------------------------------------------------------------------------
    def on_append(self, end_offset: int) -> None:
        """The master's log now ends at ``end_offset`` (called after each append)."""
        self._appends.append((end_offset, time.monotonic()))

    def lag(self) -> list[SlaveLag]:
        """Per connected slave: bytes behind the master's end, and ms since the master wrote the
        first byte it lacks (0 when it holds everything)."""
        top = self._max_offset()
        now = time.monotonic()
        out = []
        with self._lock:
            samples = list(self._appends)
            conns = list(self._connections)
        for c in conns:
            behind = max(top - max(c.ack_offset, 0), 0)
            lag_ms = 0
            if behind:
                first = next((t for end, t in samples if end > c.ack_offset), None)
                lag_ms = int((now - first) * 1000) if first is not None else 0
            out.append(
                SlaveLag(
                    c.address,
                    c.broker_id,
                    c.ack_offset,
                    behind,
                    lag_ms,
                    c.ack_offset >= 0 and behind < self.max_gap,
                    int((now - c.connected_at) * 1000),
                )
            )
        return out
