"""PopState: consumer groups' pop ("receive and ack") progress, kept in the CommitLog.

The RocketMQ 5 consumption model (PopMessageProcessor / AckMessageProcessor / PopReviveService):
a receive *pops* messages from a queue for a group; they become invisible for an invisible time
and are handed out with a receipt handle; an ack removes them for the group; a message whose
invisible time passes without an ack is delivered again with its delivery attempt + 1; after the
group's maximum attempts it goes to the group's dead-letter queue (``%DLQ%<group>``).

State per (group, topic, queue id):

- ``pop_offset``: the first queue offset never popped;
- ``inflight``: popped units not finished yet, by queue offset: the unit (CommitLog offset,
  size, tags code), the delivery ``attempt`` (1 on the first delivery), ``visible_at`` (ms since
  the epoch: when it may be delivered again) and ``seq``, which changes at every delivery and
  every change of invisible time, so a stale receipt handle is recognised.

Everything below ``pop_offset`` that is not in flight is finished (acked, filtered out by tag, or
forwarded to the DLQ); the *consumer offset* committed to :class:`ConsumerOffsetManager` is the
lowest in-flight offset, else ``pop_offset`` (RocketMQ's ack offset).

Journal in the log. Where RocketMQ writes PopCheckPoint and AckMsg records into a revive topic,
every pop, ack, change of invisible time and finish here produces one *journal record*
(:meth:`take_records`): JSON ``{"seq": N, "e": [entry, ...]}``, one entry per queue it touched,
``{"g": group, "t": topic, "q": queue id, "o": pop offset, "s": [rows set], "a": [offsets
finished]}``. The dispatch service appends them to the CommitLog (system topic
``rmq_sys_pop_journal``, tags code = ``seq``: libstore.system_topics), so they replicate with
the log, and every replica's dispatch applies them in log order (:meth:`apply_record`): a slave
holds the same pop state as its master, and a promoted slave does not deliver acked messages
again. ``seq`` numbers the records (and the deliveries) and only grows; a record whose ``seq``
is not past the state's is already in it (the master applied it when it made it), so applying
the log twice changes nothing. The writer appends the records in the order this class made
them, one writer at a time, and starts only once the state holds the whole log, so the log's
order is the ``seq`` order; numbers given to records whose append failed are never handed out
again (:meth:`reserve_seqs_through`).

Snapshots (:meth:`snapshot`) save the state with where it stands in the journal: the next
journal unit to read and the CommitLog offset just past the last record folded in; the newest
few are kept (``popSnapshot.<offset>.json``), so when the log is cut (a returning master, a crash
that lost a tail) the state goes back to one taken before the cut and the records after it are
applied again. Deleting ``pop/`` rebuilds the state from the whole journal.

FIFO (a group consuming orderly, RocketMQ ``consumeMessageOrderly``): a queue with any message in
flight and still invisible yields nothing; when the invisible time passes, the in-flight
messages are delivered again in queue order before anything newer.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from libstore._files import atomic_write, fsync_dir, read_json
from libstore.consume_queue import BLANK_UNIT_SIZE, CqUnit
from libstore.errors import InvalidArgumentError, InvalidReceiptHandleError, StoreIOError

log = logging.getLogger(__name__)

SNAPSHOT_PREFIX = "popSnapshot."
SNAPSHOTS_KEPT = 3
LEGACY_JOURNAL_NAME = "popJournal"  # before the journal moved into the CommitLog
LEGACY_SNAPSHOT_NAME = "popSnapshot.json"
HANDLE_VERSION = "p1"

QueueKey = tuple[str, str, int]  # group, topic, queue id


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    """What a consumer holds for one delivered message. Text form:
    ``p1:<queue id>:<queue offset>:<seq>:<visible at ms>:<attempt>:<phy offset>:<size>``."""

    queue_id: int
    queue_offset: int
    seq: int
    visible_at: int
    attempt: int
    phy_offset: int
    size: int

    def encode(self) -> str:
        return (
            f"{HANDLE_VERSION}:{self.queue_id}:{self.queue_offset}:{self.seq}:{self.visible_at}"
            f":{self.attempt}:{self.phy_offset}:{self.size}"
        )

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        """Raises InvalidReceiptHandleError for anything that is not a handle of ours."""
        parts = text.split(":") if isinstance(text, str) else []
        if len(parts) != 8 or parts[0] != HANDLE_VERSION:
            raise InvalidReceiptHandleError(f"not a receipt handle: {text!r:.80}")
        try:
            qid, offset, seq, visible_at, attempt, phy, size = (int(p) for p in parts[1:])
        except ValueError:
            raise InvalidReceiptHandleError(f"not a receipt handle: {text!r:.80}") from None
        if min(qid, offset, seq, attempt, phy, size) < 0:
            raise InvalidReceiptHandleError(f"not a receipt handle: {text!r:.80}")
        return cls(qid, offset, seq, visible_at, attempt, phy, size)


@dataclass(slots=True)
class Inflight:
    """A popped, unfinished unit (see module docstring)."""

    phy_offset: int
    size: int
    tags_code: int
    attempt: int
    visible_at: int
    seq: int

    def row(self, offset: int) -> list[int]:
        """The journal and snapshot form: [queue offset, phy, size, tags code, attempt, visible at, seq]."""
        return [offset, self.phy_offset, self.size, self.tags_code, self.attempt, self.visible_at, self.seq]

    @classmethod
    def from_row(cls, row: list[object]) -> tuple[int, Inflight]:
        """The (queue offset, entry) a :meth:`row` stands for."""
        offset, *fields = (int(x) for x in row[:7])  # type: ignore[call-overload]
        return offset, cls(*fields)


@dataclass(frozen=True, slots=True)
class Popped:
    """One delivery: the unit, its attempt and handle. ``dead``: it used up its attempts and
    must go to the DLQ (the caller forwards it, then calls :meth:`PopState.finish`)."""

    topic: str
    queue_id: int
    queue_offset: int
    phy_offset: int
    size: int
    tags_code: int
    attempt: int
    handle: ReceiptHandle
    dead: bool = False


class _Queue:
    __slots__ = ("inflight", "pop_offset")

    def __init__(self, pop_offset: int) -> None:
        self.pop_offset = pop_offset
        self.inflight: dict[int, Inflight] = {}

    @property
    def consumer_offset(self) -> int:
        return min(self.inflight) if self.inflight else self.pop_offset


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One journal record to append: its sequence number and body (see module docstring)."""

    seq: int
    body: bytes


@dataclass(frozen=True, slots=True)
class JournalPosition:
    """Where a state stands in the journal: ``next_unit`` (queue offset of the next journal unit
    to read) and ``phy_end`` (CommitLog offset just past the last record folded in)."""

    next_unit: int = 0
    phy_end: int = 0


class PopState:
    """Pop progress under ``root`` (a folder, for snapshots). ``commit_offset(group, topic,
    queue_id, offset)`` is told the consumer offset whenever it moves; ``committed_offset(group,
    topic, queue_id)`` gives a queue's committed offset (-1: none) when a group first pops it."""

    def __init__(
        self,
        root: Path,
        *,
        commit_offset: Callable[[str, str, int, int], None] | None = None,
        committed_offset: Callable[[str, str, int], int] | None = None,
    ) -> None:
        self.root = Path(root)
        self._commit_offset = commit_offset
        self._committed_offset = committed_offset
        self._lock = threading.RLock()
        self._queues: dict[QueueKey, _Queue] = {}
        self._seq = 0
        self._issue_floor = 0  # no new record gets a seq at or below it (reserve_seqs_through)
        self._outbox: list[JournalRecord] = []
        self.position = JournalPosition()

    # -- life -------------------------------------------------------------------------------------
    def load(self, max_phy_end: int | None = None) -> JournalPosition:
        """Start from the newest snapshot taken at or before CommitLog offset ``max_phy_end``
        (any, when None), or from nothing; returns its journal position (the caller applies the
        journal from there). Unsent records are dropped. Raises StoreIOError when a snapshot
        exists but does not parse."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._queues = {}
            self._seq = 0
            self._outbox = []
            self.position = JournalPosition()
            snaps = [
                f for f in self._snapshot_files() if max_phy_end is None or _snapshot_end(f) <= max_phy_end
            ]
            if snaps:
                self._read_snapshot(snaps[-1])
            elif max_phy_end is None:
                self._import_legacy()
            return self.position

    def _snapshot_files(self) -> list[Path]:
        """Snapshot files, oldest first."""
        found = [
            f
            for f in self.root.glob(SNAPSHOT_PREFIX + "*.json")
            if f.name[len(SNAPSHOT_PREFIX) : -len(".json")].isdigit()
        ]
        return sorted(found, key=_snapshot_end)

    def _read_snapshot(self, path: Path) -> None:
        data = read_json(path, "pop snapshot")
        self._take_snapshot_data(data, path)
        self.position = JournalPosition(int(data.get("nextUnit", 0)), int(data.get("phyEnd", 0)))

    def _take_snapshot_data(self, data: dict[str, object], path: Path) -> None:
        """Queues and seq from a parsed snapshot (either version). Raises StoreIOError."""
        try:
            self._seq = int(data.get("seq", 0))  # type: ignore[call-overload]
            for row in data.get("queues", []):  # type: ignore[attr-defined]
                group, topic, qid, pop_offset, inflight = row
                q = _Queue(int(pop_offset))
                for e in inflight:
                    offset, entry = Inflight.from_row(e)
                    q.inflight[offset] = entry
                self._queues[(str(group), str(topic), int(qid))] = q
        except (ValueError, TypeError, AttributeError) as exc:
            raise StoreIOError(f"pop snapshot {path} is not valid: {exc}") from exc

    def _import_legacy(self) -> None:
        """State kept by an older version in ``popSnapshot.json`` + ``popJournal`` (a local
        journal, one JSON entry per line): taken as the starting state, at journal position 0."""
        legacy_snap = self.root / LEGACY_SNAPSHOT_NAME
        data = read_json(legacy_snap, "pop snapshot")
        if data is not None:
            self._take_snapshot_data(data, legacy_snap)
        journal = self.root / LEGACY_JOURNAL_NAME
        if journal.exists():
            for line in journal.read_bytes().split(b"\n"):
                if not line:
                    continue
                try:
                    self._apply_entry(json.loads(line))
                except (ValueError, TypeError, KeyError, IndexError):
                    break  # a torn last line
        if data is not None or journal.exists():
            log.info("pop state imported from %s", self.root)

    def retire_legacy(self) -> None:
        """Delete the older version's files once a snapshot holds what they said."""
        for name in (LEGACY_JOURNAL_NAME, LEGACY_SNAPSHOT_NAME):
            (self.root / name).unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing to release (the journal is in the CommitLog); kept for the service's life cycle."""

    # -- journal ------------------------------------------------------------------------------------
    def _log(
        self, key: QueueKey, q: _Queue, sets: Iterable[list[int]] = (), acks: Iterable[int] = ()
    ) -> None:
        """Make the journal record of one operation on one queue (lock held)."""
        entry: dict[str, object] = {"g": key[0], "t": key[1], "q": key[2], "o": q.pop_offset}
        sets, acks = list(sets), list(acks)
        if sets:
            entry["s"] = sets
        if acks:
            entry["a"] = acks
        seq = self._next_seq()
        body = json.dumps({"seq": seq, "e": [entry]}, separators=(",", ":")).encode()
        self._outbox.append(JournalRecord(seq, body))

    def take_records(self) -> list[JournalRecord]:
        """The journal records made since the last call, in order (the caller appends them)."""
        with self._lock:
            out, self._outbox = self._outbox, []
            return out

    @property
    def seq(self) -> int:
        """The newest sequence number the state holds."""
        return self._seq

    def apply_record(self, body: bytes, phy_end: int, next_unit: int) -> bool:
        """Fold one journal record read from the log (its CommitLog end offset ``phy_end``, the
        journal queue offset after it ``next_unit``) into the state; False when the state holds
        it already (its ``seq`` is not past the state's). Raises ValueError for a body that is
        not a journal record."""
        try:
            rec = json.loads(body)
            seq = int(rec["seq"])
            entries = list(rec["e"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a pop journal record: {exc}") from exc
        with self._lock:
            if seq > self._seq:
                for entry in entries:
                    self._apply_entry(entry, commit=True)
                self._seq = seq
                applied = True
            else:
                applied = False
            self.position = JournalPosition(next_unit, phy_end)
        return applied

    def skip_record(self, phy_end: int, next_unit: int) -> None:
        """Move the journal position past a record the state holds already (seq not past it)."""
        with self._lock:
            self.position = JournalPosition(next_unit, phy_end)

    def _apply_entry(self, rec: dict[str, object], commit: bool = False) -> None:
        key: QueueKey = (str(rec["g"]), str(rec["t"]), int(rec["q"]))  # type: ignore[call-overload]
        pop_offset = int(rec.get("o", 0))  # type: ignore[call-overload]
        q = self._queues.get(key)
        before = -1 if q is None else q.consumer_offset
        if q is None:
            q = self._queues[key] = _Queue(pop_offset)
        q.pop_offset = max(q.pop_offset, pop_offset)
        for e in rec.get("s", []):  # type: ignore[attr-defined]
            offset, entry = Inflight.from_row(e)
            q.inflight[offset] = entry
            self._seq = max(self._seq, entry.seq)
        for offset in rec.get("a", []):  # type: ignore[attr-defined]
            q.inflight.pop(int(offset), None)
        if commit and q.consumer_offset != before:
            self._committed(key, q)

    def snapshot(self) -> Path:
        """Save the state at its journal position, durably (:meth:`snapshot_bytes` then
        :meth:`write_snapshot`). Raises StoreIOError."""
        return self.write_snapshot(*self.snapshot_bytes())

    def snapshot_bytes(self) -> tuple[int, bytes]:
        """The state as a snapshot: (CommitLog offset it stands at, file contents). Take it only
        when every record made has been appended and folded in (the position then covers the
        whole state). Raises StoreIOError when records are still waiting to be appended."""
        with self._lock:
            if self._outbox:
                raise StoreIOError("pop state has journal records not yet appended; not a snapshot point")
            queues = [
                [g, t, qid, q.pop_offset, [e.row(o) for o, e in sorted(q.inflight.items())]]
                for (g, t, qid), q in self._queues.items()
            ]
            pos = self.position
            data = {
                "version": 2,
                "seq": self._seq,
                "nextUnit": pos.next_unit,
                "phyEnd": pos.phy_end,
                "queues": queues,
            }
        return pos.phy_end, json.dumps(data, separators=(",", ":")).encode()

    def write_snapshot(self, phy_end: int, data: bytes) -> Path:
        """Write a snapshot made by :meth:`snapshot_bytes`, durably, and keep the newest
        ``SNAPSHOTS_KEPT``. Raises StoreIOError."""
        path = self.root / f"{SNAPSHOT_PREFIX}{phy_end:020d}.json"
        atomic_write(path, data)
        for old in self._snapshot_files()[:-SNAPSHOTS_KEPT]:
            old.unlink(missing_ok=True)
        return path

    def discard_snapshots_after(self, phy_end: int) -> int:
        """Delete the snapshots taken past CommitLog offset ``phy_end`` (the log was cut there:
        they hold records it no longer has); returns how many."""
        gone = [f for f in self._snapshot_files() if _snapshot_end(f) > phy_end]
        for f in gone:
            f.unlink(missing_ok=True)
        if gone:
            fsync_dir(self.root)
        return len(gone)

    def reserve_seqs_through(self, seq: int) -> None:
        """Never hand out a sequence number at or below ``seq``: numbers already given to records
        that may be in the log although this state does not hold them (an append that failed
        after all). Records read from the log are still folded in by their own numbers."""
        with self._lock:
            self._issue_floor = max(self._issue_floor, seq)

    def _next_seq(self) -> int:
        """A new sequence number (lock held): past every one the state holds or reserved."""
        self._seq = max(self._seq, self._issue_floor) + 1
        return self._seq

    # -- queries ------------------------------------------------------------------------------------
    def _queue(self, key: QueueKey, min_offset: int, initial: Callable[[], int] | None = None) -> _Queue:
        q = self._queues.get(key)
        if q is None:
            start = self._committed_offset(*key) if self._committed_offset else -1
            if start < 0 and initial is not None:
                start = initial()  # where a group without an offset starts (consume_from)
            q = self._queues[key] = _Queue(max(start, min_offset) if start >= 0 else min_offset)
        elif q.pop_offset < min_offset and not q.inflight:
            q.pop_offset = min_offset  # the files below were cleaned up
        return q

    def consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's ack offset of the queue, -1 when it never popped it."""
        with self._lock:
            q = self._queues.get((group, topic, queue_id))
            return q.consumer_offset if q is not None else -1

    def next_visible_at(self, group: str, topic: str) -> int | None:
        """The earliest time (ms) an in-flight message of (group, topic) becomes deliverable again."""
        with self._lock:
            times = [
                e.visible_at
                for (g, t, _), q in self._queues.items()
                if g == group and t == topic
                for e in q.inflight.values()
            ]
        return min(times) if times else None

    def expired(self, now_ms: int, max_attempts_of: Callable[[str], int]) -> list[tuple[str, Popped]]:
        """(group, message) for in-flight messages out of attempts (delivered
        ``max_attempts_of(group)`` times) whose invisible time passed: the revive scan (RocketMQ's
        PopReviveService), so such a message reaches the DLQ without waiting for a consumer to
        pop again. The handles carry the current ``seq`` (for :meth:`finish`)."""
        with self._lock:
            found = [
                (g, t, qid, o, e)
                for (g, t, qid), q in self._queues.items()
                for o, e in q.inflight.items()
                if e.visible_at <= now_ms
            ]
            limits = {g: max_attempts_of(g) for g in {f[0] for f in found}}
            return [
                (g, self._popped(t, qid, o, e, dead=True))
                for g, t, qid, o, e in found
                if e.attempt >= limits[g]
            ]

    # -- pop ----------------------------------------------------------------------------------------
    def pop(
        self,
        group: str,
        topic: str,
        queue_id: int,
        *,
        read_units: Callable[[int, int], list[CqUnit]],
        min_offset: int,
        max_offset: int,
        max_count: int,
        invisible_ms: int,
        now_ms: int,
        matches_code: Callable[[int], bool] = lambda _c: True,
        fifo: bool = False,
        max_attempts: int = 17,
        initial_offset: Callable[[], int] | None = None,
    ) -> list[Popped]:
        """Pop up to ``max_count`` messages of one queue: in-flight messages whose invisible time
        passed first (attempt + 1), then units from the pop offset (attempt 1). Units whose tags
        code ``matches_code`` rejects, and blank units, are finished without delivery.
        ``read_units(offset, n)`` reads the queue's units; ``min_offset``/``max_offset`` are its
        bounds. A redelivery past ``max_attempts`` comes back with ``dead`` set and keeps its
        handle's invisible time (``invisible_ms``) until :meth:`finish`. A group that never
        popped the queue and has no committed offset starts at ``initial_offset()`` (default:
        ``min_offset``); that start is journaled and committed at once, so it holds across a
        restart even when nothing was popped.
        Raises InvalidArgumentError for a non-positive count or invisible time."""
        if max_count <= 0:
            raise InvalidArgumentError(f"pop count must be positive, got {max_count}")
        if invisible_ms <= 0:
            raise InvalidArgumentError(f"invisible time must be positive, got {invisible_ms} ms")
        key = (group, topic, queue_id)
        out: list[Popped] = []
        with self._lock:
            new = key not in self._queues
            q = self._queue(key, min_offset, initial_offset)
            if new and initial_offset is not None:
                self._log(key, q)  # the start holds even if nothing is popped now
                self._committed(key, q)
            if fifo and any(e.visible_at > now_ms for e in q.inflight.values()):
                return out  # the queue is locked until its messages are acked or time out
            sets: list[list[int]] = []
            for offset in sorted(o for o, e in q.inflight.items() if e.visible_at <= now_ms):
                if len(out) >= max_count:
                    break
                e = q.inflight[offset]
                dead = e.attempt >= max_attempts
                if not dead:
                    e.attempt += 1
                e.visible_at, e.seq = now_ms + invisible_ms, self._next_seq()
                sets.append(e.row(offset))
                out.append(self._popped(topic, queue_id, offset, e, dead=dead))
            if fifo and q.inflight:
                if sets:
                    self._log(key, q, sets)
                return out  # nothing newer until what is in flight is finished
            before = q.consumer_offset
            scan = max(max_count * 4, 64)
            while len(out) < max_count and q.pop_offset < max_offset:
                units = read_units(q.pop_offset, min(scan, max_offset - q.pop_offset))
                if not units:
                    break
                for unit in units:
                    if len(out) >= max_count:
                        break
                    q.pop_offset = unit.queue_offset + 1
                    if unit.size == BLANK_UNIT_SIZE or not matches_code(unit.tags_code):
                        continue
                    e = Inflight(
                        unit.phy_offset, unit.size, unit.tags_code, 1, now_ms + invisible_ms, self._next_seq()
                    )
                    q.inflight[unit.queue_offset] = e
                    sets.append(e.row(unit.queue_offset))
                    out.append(self._popped(topic, queue_id, unit.queue_offset, e))
            if sets or q.consumer_offset != before:
                self._log(key, q, sets)
                self._committed(key, q)
        return out

    @staticmethod
    def _popped(topic: str, queue_id: int, offset: int, e: Inflight, *, dead: bool = False) -> Popped:
        handle = ReceiptHandle(queue_id, offset, e.seq, e.visible_at, e.attempt, e.phy_offset, e.size)
        return Popped(topic, queue_id, offset, e.phy_offset, e.size, e.tags_code, e.attempt, handle, dead)

    def _committed(self, key: QueueKey, q: _Queue) -> None:
        if self._commit_offset is not None:
            self._commit_offset(key[0], key[1], key[2], q.consumer_offset)

    # -- ack / change ---------------------------------------------------------------------------------
    def _live(self, key: QueueKey, handle: ReceiptHandle, now_ms: int) -> tuple[_Queue, Inflight | None]:
        """The queue and in-flight entry a handle names; None when the message is already
        finished. Raises InvalidReceiptHandleError for an expired or superseded handle."""
        if handle.visible_at <= now_ms:
            raise InvalidReceiptHandleError("the receipt handle has expired (its invisible time passed)")
        q = self._queues.get(key)
        if q is None or handle.queue_offset >= q.pop_offset:
            raise InvalidReceiptHandleError("the receipt handle names a message this group never received")
        e = q.inflight.get(handle.queue_offset)
        if e is not None and e.seq != handle.seq:
            raise InvalidReceiptHandleError("the receipt handle was replaced by a later delivery or change")
        return q, e

    def ack(self, group: str, topic: str, handle: ReceiptHandle, now_ms: int) -> None:
        """Finish the message for the group. Acking a message already finished is a no-op (a
        retried ack). Raises InvalidReceiptHandleError (see :meth:`_live`)."""
        key = (group, topic, handle.queue_id)
        with self._lock:
            q, e = self._live(key, handle, now_ms)
            if e is not None:
                self._remove(key, q, handle.queue_offset)

    def _remove(self, key: QueueKey, q: _Queue, queue_offset: int) -> None:
        """Finish one in-flight unit: journal it, commit the consumer offset if it moved."""
        before = q.consumer_offset
        del q.inflight[queue_offset]
        self._log(key, q, acks=[queue_offset])
        if q.consumer_offset != before:
            self._committed(key, q)

    def in_flight(self, group: str, topic: str, handle: ReceiptHandle, now_ms: int) -> Popped:
        """The delivery a live ``handle`` names, as the store recorded it (never the handle's
        own copy of the offsets), marked ``dead`` for forwarding to the DLQ. Raises
        InvalidReceiptHandleError for an expired, superseded or foreign handle, or a message
        already acked."""
        with self._lock:
            _, e = self._live((group, topic, handle.queue_id), handle, now_ms)
            if e is None:
                raise InvalidReceiptHandleError("the message was already acked")
            return self._popped(topic, handle.queue_id, handle.queue_offset, e, dead=True)

    def finish(self, group: str, topic: str, queue_id: int, queue_offset: int, seq: int) -> bool:
        """Finish an in-flight message without a live handle (after forwarding it to the DLQ).
        False when it was finished already or delivered again since (``seq`` differs)."""
        key = (group, topic, queue_id)
        with self._lock:
            q = self._queues.get(key)
            e = q.inflight.get(queue_offset) if q is not None else None
            if q is None or e is None or e.seq != seq:
                return False
            self._remove(key, q, queue_offset)
            return True

    def change_invisible(
        self, group: str, topic: str, handle: ReceiptHandle, invisible_ms: int, now_ms: int
    ) -> ReceiptHandle:
        """Make the message invisible for ``invisible_ms`` from now; returns the new handle (the
        old one stops working). When that time passes the message is delivered again with
        attempt + 1 (how a consumer's nack with a back-off works). Raises
        InvalidReceiptHandleError (also for a message already finished) or InvalidArgumentError."""
        if invisible_ms < 0:
            raise InvalidArgumentError(f"invisible time must not be negative, got {invisible_ms} ms")
        key = (group, topic, handle.queue_id)
        with self._lock:
            q, e = self._live(key, handle, now_ms)
            if e is None:
                raise InvalidReceiptHandleError("the message was already acked")
            e.visible_at, e.seq = now_ms + invisible_ms, self._next_seq()
            self._log(key, q, [e.row(handle.queue_offset)])
            return self._popped(topic, handle.queue_id, handle.queue_offset, e).handle


def _snapshot_end(path: Path) -> int:
    """The CommitLog offset a snapshot file's name gives (``popSnapshot.<offset>.json``)."""
    return int(path.name[len(SNAPSHOT_PREFIX) : -len(".json")])
