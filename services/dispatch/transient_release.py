"""TransientRelease: free the transient messages every consumer group has consumed.

A transient message's record lives in the commitlog's memory (libstore.transient_messages) under
its stub's CommitLog offset. Without this, only retention freed it (when the CommitLog segment
holding the stub went, 72 h by default), so a transient topic that producers kept writing and
consumers kept draining filled ``transientStoreMaxBytes`` and then ``transientScratchMaxBytes``
and was refused with SYSTEM_BUSY until then. RabbitMQ frees a transient message once its
queue's consumer acknowledged it; the equivalent here is a message that every consumer group
reading its queue has consumed.

This dispatch-side part notes, as records are dispatched, the last queue offset of a transient
stub in each queue (:meth:`TransientRelease.dispatch_runs`), and every ``RELEASE_INTERVAL_S``
computes a *release point* and a *keep list* (:meth:`TransientRelease.release_plan`): the
commitlog frees the transient messages whose stubs lie before the point, except those the keep
list names (CommitLogPort.release_transient); a pull or receive that asks for a freed one later
passes over it as removed, as after a restart. Stubs not yet dispatched lie past the dispatched
offset, so that is where the point starts. Then, for each queue that has had a transient stub,
the queue's consumed offset is the lowest committed offset of the groups that committed any
offset for the topic (a pop group's is its oldest unacknowledged message, libstore.pop_state).
The queue is held at its min offset when no group committed one for it. Past its last
transient stub, a queue holds nothing back. Otherwise its units from the consumed offset to its
last stub are still wanted: the queues with the fewest such units name them in the keep list
(up to ``KEEP_MAX`` in all: a dead-letter queue that receives a copy now and then and that
nobody reads, a consumer a few messages behind), and each of the others caps the point at the
CommitLog offset of its first unit not consumed.

So a transient message stays while any group that has consumed its topic has not consumed it,
and while nobody has consumed its queue yet (a producer that starts before its consumers
loses nothing). A group that stopped for good holds its topics' transient messages until its
offsets are removed, as an unconsumed RabbitMQ queue holds its messages. While what it holds
fits in the keep list, the rest is freed around it; past that, release is in CommitLog order and
such a queue holds back the transient messages of every topic after its first one; the store's
bounds and SYSTEM_BUSY still apply. A group moved back by an offset reset does not hold again
what every group had consumed before.

The noted stubs are saved next to the dispatch checkpoint (``transientStubs.json``, written
after the checkpoint's reput offset is sampled, so it covers every stub before it: dispatch
resumes there after a restart and notes the later ones again); without it, a restarted
dispatch service would not know the queues whose transient messages the commitlog still
holds and would free them. After a cut of the log, the noted offsets are clamped to the
queues' new ends (:meth:`TransientRelease.clamp`).

Thread-safety: ``dispatch_batch`` and ``dispatch_runs`` may run on a worker thread (a large
chunk); the rest runs on the dispatch service's event loop; the noted stubs are shared under a
lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from libstore._files import atomic_write, read_json
from libstore.aio_deadline import wait_within
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.consumer_offset_manager import ConsumerOffsetManager
from libstore.dispatch_request import DispatchRequest
from libstore.errors import StoreError, StoreIOError
from libstore.queue_runs import QueueRun, queue_runs
from services.ports import CommitLogPort

log = logging.getLogger(__name__)

RELEASE_INTERVAL_S = 1.0  # how often a release point is computed and handed to the commitlog
KEEP_MAX = 4096  # units a round may name to keep (8 bytes each on the wire) instead of capping the point
STUBS_FILE = "transientStubs.json"


class TransientRelease:
    """The release rounds of one dispatch service (module docstring). ``position()``: (the
    CommitLog offset up to which records are dispatched, the log id and generation they were
    read in: a point goes to the commitlog with them, and one computed before a cut of the log
    frees nothing)."""

    def __init__(
        self,
        queues: ConsumeQueueStore,
        offsets: ConsumerOffsetManager,
        commitlog: CommitLogPort,
        position: Callable[[], tuple[int, str, int]],
    ) -> None:
        self.queues = queues
        self.offsets = offsets
        self.commitlog = commitlog
        self._position = position
        self.path = Path(queues.store_path) / STUBS_FILE
        self._last_stub: dict[tuple[str, int], int] = {}  # (topic, queue id) -> queue offset
        self._lock = threading.Lock()
        self._changes = 0  # changes to _last_stub, so that save() writes only after one
        self._saved = 0
        self.released_below = 0  # the highest release point the commitlog took
        self._kept: frozenset[int] = frozenset()  # the keep list the commitlog last took
        self._released_in = ("", 0)  # the log id and generation released_below is of
        self.messages_released = 0  # transient messages the commitlog freed, since start
        self.rounds = 0  # rounds run (freeing or not, reaching the commitlog or not), since start

    def dispatch_batch(self, requests: Sequence[DispatchRequest]) -> None:
        """CommitLogDispatcher: note the transient stubs among ``requests`` (idempotent)."""
        self.dispatch_runs(queue_runs(requests, with_units=False))

    def dispatch_runs(self, runs: Sequence[QueueRun]) -> None:
        """:meth:`dispatch_batch` for records grouped by queue (libstore.queue_runs gives each
        queue's last stub: a look per queue, not per record)."""
        seen = [((topic, queue_id), stub) for topic, queue_id, *_, stub in runs if stub >= 0]
        if seen:
            with self._lock:
                last = self._last_stub
                for key, offset in seen:
                    if offset > last.get(key, -1):
                        last[key] = offset
                        self._changes += 1

    def load(self) -> None:
        """Read the saved stubs. Raises StoreIOError when the file is unreadable."""
        raw = read_json(self.path, "transient stubs") or []
        try:
            stubs = {(str(t), int(q)): int(o) for t, q, o in raw}
        except (TypeError, ValueError) as exc:
            raise StoreIOError(f"cannot read {self.path}: {exc}") from exc
        with self._lock:
            self._last_stub = stubs

    def save(self) -> None:
        """Write the noted stubs (after the checkpoint's offset was sampled) when they changed
        since the last save. Raises StoreIOError."""
        with self._lock:
            changes = self._changes
            if changes == self._saved:
                return
            rows = [[t, q, o] for (t, q), o in sorted(self._last_stub.items())]
        atomic_write(self.path, json.dumps(rows).encode())
        self._saved = changes

    def clamp(self) -> None:
        """The log was cut and the ConsumeQueues with it: no noted stub lies past a queue's end."""
        with self._lock:
            for key, last in list(self._last_stub.items()):
                cq = self.queues.find(*key)
                end = cq.max_offset_in_queue if cq is not None else 0
                if end <= 0:
                    del self._last_stub[key]
                    self._changes += 1
                elif last >= end:
                    self._last_stub[key] = end - 1
                    self._changes += 1

    def release_plan(self) -> tuple[int, list[int]]:
        """(the CommitLog offset before which no transient message is wanted but those at the
        CommitLog offsets listed, ascending; module docstring)."""
        point, _, keep = self._survey(self._position()[0])
        return point, keep

    def _survey(self, point: int) -> tuple[int, list[tuple[tuple[str, int], int]], list[int]]:
        """(the release point, at most ``point``; the noted queues whose stubs every group has
        consumed: entries that :meth:`release_once` forgets once the commitlog took the point;
        the keep list, below the point)."""
        groups_of: dict[str, list[str]] = {}
        for group, topic in self.offsets.groups():
            groups_of.setdefault(topic, []).append(group)
        with self._lock:
            stubs = list(self._last_stub.items())
        done = []
        wanted = []  # (how many units it still waits for, the queue, the first of them)
        for (topic, queue_id), last in stubs:
            cq = self.queues.find(topic, queue_id)
            if cq is None:  # the topic was deleted: its messages are expired anyway
                done.append(((topic, queue_id), last))
                continue
            floor = cq.min_offset_in_queue
            committed = [self._committed(g, topic, queue_id) for g in groups_of.get(topic, ())]
            # No group, or one without an offset for this queue: held from the queue's start.
            consumed = max(min(committed), floor) if committed and min(committed) >= 0 else floor
            end = min(last + 1, cq.max_offset_in_queue)
            if consumed >= end:
                done.append(((topic, queue_id), last))
                continue
            wanted.append((end - consumed, cq, consumed))
        keep: list[int] = []
        wanted.sort(key=lambda w: w[0])
        for count, cq, consumed in wanted:
            if len(keep) + count <= KEEP_MAX:
                phys = cq.read_columns(consumed, count).phy_offsets  # no object per unit
                if len(phys) == count:
                    keep += phys
                    continue
            unit = cq.read_unit(consumed)
            if unit is None:  # not readable now (being cut or cleaned): hold everything
                return min(point, self.released_below), [], sorted(self._kept)
            point = min(point, unit.phy_offset)
        return point, done, sorted(k for k in keep if k < point)

    def _committed(self, group: str, topic: str, queue_id: int) -> int:
        try:
            return self.offsets.query_offset(group, topic, queue_id)
        except StoreError:  # a name the offsets file holds but no longer passes the checks
            return 2**63 - 1  # holds nothing: it cannot consume

    async def release_once(self) -> int:
        """One round: compute the point and, when it moved, hand it to the commitlog. Returns how
        many messages the commitlog freed. Raises what the port raises."""
        reput, log_id, generation = self._position()
        if (log_id, generation) != self._released_in:  # a new log or a cut: start over
            self._released_in = (log_id, generation)
            self.released_below = 0
            self._kept = frozenset()
        point, done, keep = self._survey(reput)
        if point <= self.released_below and self._kept.issubset(keep):
            return 0  # nothing below the last point is newly free
        freed = await self.commitlog.release_transient(point, log_id, generation, keep)
        self.released_below = max(self.released_below, point)
        self._kept = frozenset(keep)
        self.messages_released += freed
        with self._lock:
            for key, last in done:
                if self._last_stub.get(key) == last:  # no later stub was noted meanwhile
                    del self._last_stub[key]
                    self._changes += 1
        return freed

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds every RELEASE_INTERVAL_S until ``stop`` is set; a round that cannot reach the
        commitlog is retried in the next."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await wait_within(stop.wait(), RELEASE_INTERVAL_S)
            if stop.is_set():
                return
            try:
                await self.release_once()
            except (StoreError, grpc.RpcError) as exc:
                log.info("transient release skipped this round (%s)", exc)
            self.rounds += 1
