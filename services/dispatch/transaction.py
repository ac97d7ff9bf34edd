"""TransactionService: ends transactions and schedules check-backs of unresolved half messages
(libstore.transaction_message), on the dispatch service that holds the half and op queues.

* :meth:`end` (EndTransaction): COMMIT appends the committed copy to the real topic, then the op
  record; ROLLBACK appends the op record only. Ending an already resolved transaction is OK and
  does nothing (a producer's retry, or a checker answering late).
* :meth:`claim_checks`: half messages older than ``transactionTimeOut`` (or their
  CHECK_IMMUNITY_TIME_IN_SECONDS), unresolved, whose check is due, for the topics a gateway has
  producers for. Each claim counts one check and schedules the next ``transactionCheckInterval``
  later; past ``transactionCheckMax`` checks the half message is dropped (an op record with
  resolution DISCARD, as RocketMQ gives up after transactionCheckMax). Check counts persist in
  ``transaction/checkState.json``; the pending list is rebuilt from the half and op queues'
  units after a restart.
* :meth:`sweep_orphans`: a half message no gateway claimed for a whole interval after its check
  was due (no producer of its topic connected anywhere) has the check counted anyway, so
  ``transactionCheckMax`` still ends it, as RocketMQ counts every check round.

Gateways call claim_checks periodically and push each claimed message to a producer of its topic
over the Telemetry stream (services.gateway.rocketmq); the producer's checker answers with an
EndTransaction. Since producers are connection state, the gateway that has one claims for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from libstore._files import atomic_write, read_json
from libstore.aio_deadline import wait_within
from libstore.consume_queue import BLANK_UNIT_SIZE
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.errors import (
    CorruptRecordError,
    InvalidArgumentError,
    NotMasterError,
    ServiceNotAvailableError,
    StoreIOError,
)
from libstore.message import MessageConst, ascii_int
from libstore.record_codec import decode_record
from libstore.system_topics import HALF_TOPIC, OP_TOPIC
from libstore.transaction_message import TransactionId, committed_copy, op_message
from services._common.telemetry import tracer
from services.ports import CommitLogPort, TransactionCheck

log = logging.getLogger(__name__)

SCAN_BATCH = 4096
CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Half:
    store_ms: int
    phy_offset: int
    size: int
    checks: int = 0
    next_check_ms: int = 0  # 0: from the timeout (first check)
    real_topic: str | None = None  # learnt at the first read of the record


class TransactionService:
    """Half/op queues from ``queues``, appends through ``commitlog``, state under
    ``root/transaction``. Times in ms; ``timeout_ms``/``interval_ms``/``check_max`` are
    transactionTimeOut, transactionCheckInterval and transactionCheckMax."""

    def __init__(
        self,
        root: Path,
        queues: ConsumeQueueStore,
        commitlog: CommitLogPort,
        *,
        timeout_ms: int = 6000,
        interval_ms: int = 30_000,
        check_max: int = 15,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.queues = queues
        self.commitlog = commitlog
        self.timeout_ms = timeout_ms
        self.interval_ms = interval_ms
        self.check_max = check_max
        self.clock = clock
        self.state_path = Path(root) / "transaction" / "checkState.json"
        self.pending: dict[int, _Half] = {}  # half queue offset -> unresolved half message
        self._half_scanned = 0
        self._op_scanned = 0
        self._ended: set[int] = set()  # resolved here before dispatch listed the half
        self._loaded_checks: dict[int, tuple[int, int]] = {}  # from the state file, until scanned
        self._locks: dict[int, asyncio.Lock] = {}  # one resolution at a time per half message
        self._claimed_for: dict[str, int] = {}  # topic -> when a gateway last claimed for it, ms
        self._tracer = tracer("mqstore.dispatch")

    def load(self) -> None:
        """Raises StoreIOError for a malformed state file."""
        data = read_json(self.state_path, "transaction check state") or {}
        try:
            self._loaded_checks = {int(k): (int(v[0]), int(v[1])) for k, v in data.items()}
        except (TypeError, ValueError, IndexError) as exc:
            raise StoreIOError(f"transaction check state {self.state_path} is malformed: {exc}") from exc
        self.pending.clear()
        self._half_scanned = self._op_scanned = 0

    def _scan(self) -> None:
        """List new half units, then drop those the new op units resolve (an op is always
        dispatched after its half, so halves go first)."""
        half = self.queues.find(HALF_TOPIC, 0)
        if half is not None:
            if half.max_offset_in_queue < self._half_scanned:
                self.pending.clear()  # the log was cut: start over
                self._half_scanned = self._op_scanned = 0
            self._half_scanned = max(self._half_scanned, half.min_offset_in_queue)
            while self._half_scanned < half.max_offset_in_queue:
                units = half.read_units(self._half_scanned, SCAN_BATCH)
                if not units:
                    break
                for i, u in enumerate(units):
                    offset = self._half_scanned + i
                    if u.size == BLANK_UNIT_SIZE or offset in self._ended:
                        self._ended.discard(offset)
                        continue
                    checks, nxt = self._loaded_checks.pop(offset, (0, 0))
                    self.pending[offset] = _Half(u.tags_code, u.phy_offset, u.size, checks, nxt)
                self._half_scanned += len(units)
        op = self.queues.find(OP_TOPIC, 0)
        if op is not None:
            self._op_scanned = max(self._op_scanned, op.min_offset_in_queue)
            while self._op_scanned < op.max_offset_in_queue:
                units = op.read_units(self._op_scanned, SCAN_BATCH)
                if not units:
                    break
                for u in units:
                    if u.size == BLANK_UNIT_SIZE:
                        continue
                    if self.pending.pop(u.tags_code, None) is None and u.tags_code >= self._half_scanned:
                        # dispatched between the two loops above: its half comes in the next scan
                        self._ended.add(u.tags_code)
                self._op_scanned += len(units)

    # -- end ------------------------------------------------------------------------------------
    def _resolved(self, half_offset: int) -> bool:
        self._scan()
        return half_offset in self._ended or (
            half_offset < self._half_scanned and half_offset not in self.pending
        )

    @contextlib.asynccontextmanager
    async def _resolving(self, half_offset: int) -> AsyncIterator[None]:
        """Hold the half message's lock: concurrent ends (a retry, a late checker answer, the
        check limit) resolve it once."""
        lock = self._locks.setdefault(half_offset, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and self._locks.get(half_offset) is lock:
                del self._locks[half_offset]

    async def end(self, transaction_id: str, message_id: str, commit: bool, topic: str) -> None:
        """Commit or roll back the transaction ``transaction_id`` of message ``message_id`` sent
        to ``topic`` (required: the caller was authorized for that topic, so the half message
        must be of it). Raises InvalidArgumentError for an empty topic or message id, or an id
        that names no half message of that message and topic; ServiceNotAvailableError when an
        append failed (the transaction stays open). Ending a resolved transaction does nothing."""
        tid = TransactionId.decode(transaction_id)
        if not message_id:
            raise InvalidArgumentError("the message id of the transaction is required")
        if not topic:
            raise InvalidArgumentError("the topic of the transaction is required")
        async with self._resolving(tid.half_offset):
            if self._resolved(tid.half_offset):
                return
            await self._end_locked(tid, transaction_id, message_id, commit, topic)

    async def _end_locked(
        self, tid: TransactionId, transaction_id: str, message_id: str, commit: bool, topic: str
    ) -> None:
        (raw,) = await self.commitlog.read([(tid.phy_offset, tid.size)])
        try:
            if not raw:
                raise CorruptRecordError("not in the CommitLog")
            half = decode_record(raw, check_crc=False)
        except CorruptRecordError:
            raise InvalidArgumentError(f"transaction {transaction_id} names no half message") from None
        uniq = half.properties.get(MessageConst.UNIQ_KEY, "")
        if (
            half.topic != HALF_TOPIC
            or half.queue_offset != tid.half_offset
            or uniq != message_id
            or half.properties.get(MessageConst.REAL_TOPIC) != topic
        ):
            raise InvalidArgumentError(f"transaction {transaction_id} is not message {message_id}'s")
        with self._tracer.start_as_current_span("dispatch.end_transaction") as span:
            span.set_attribute("mqstore.resolution", "COMMIT" if commit else "ROLLBACK")
            if commit:
                await self._append_all([committed_copy(half)], "committing")
            await self._resolve(tid.half_offset, "COMMIT" if commit else "ROLLBACK", uniq)

    async def _resolve(self, half_offset: int, resolution: str, uniq: str) -> None:
        await self._append_all([op_message(half_offset, resolution, uniq)], "resolving")
        half = self.pending.pop(half_offset, None)
        if half is None and half_offset >= self._half_scanned:
            self._ended.add(half_offset)
        if half is not None and half.checks:  # its count leaves the state file
            self._save()

    async def _append_all(self, messages: list, what: str) -> None:
        results = await self.commitlog.append(messages)
        bad = [r.status.name for r in results if not r.status.appended]
        if bad:
            raise ServiceNotAvailableError(f"{what} the transaction failed: {bad[0]}")

    # -- check-back -----------------------------------------------------------------------------
    async def claim_checks(self, topics: Collection[str], max_count: int = 64) -> list[TransactionCheck]:
        """Up to ``max_count`` unresolved half messages of ``topics`` whose check is due now;
        each claim counts as one check. Half messages past the check limit are dropped here.
        No topics, no checks: a caller claims for the topics its producers publish (a check
        carries the whole message, so it goes only where that topic's producers are)."""
        if not topics:
            return []
        self._scan()
        now = self.clock()
        for topic in topics:  # a producer of it is connected: the sweep leaves it to the claims
            self._claimed_for[topic] = now
        due = [
            (off, h)
            for off, h in self.pending.items()
            if (h.next_check_ms or h.store_ms + self.timeout_ms) <= now
            and (h.real_topic is None or h.real_topic in topics or h.checks >= self.check_max)
        ]
        return await self._check(due, now, topics, max_count)

    async def sweep_orphans(self) -> int:
        """Count a check for every half message overdue by a whole ``transactionCheckInterval``:
        no gateway claimed it, so no producer of its topic is connected anywhere (RocketMQ's
        check service counts a round whether or not a producer answers). Past
        ``transactionCheckMax`` such a half message is dropped as any other. Returns how many
        were counted or dropped."""
        self._scan()
        now = self.clock()
        overdue = [
            (off, h)
            for off, h in self.pending.items()
            if (h.next_check_ms or h.store_ms + self.timeout_ms) + self.interval_ms <= now
        ]
        before = len(self.pending)
        counted = await self._check(overdue, now, None, len(overdue))
        return len(counted) + before - len(self.pending)

    async def _check(
        self, due: list[tuple[int, _Half]], now: int, topics: Collection[str] | None, max_count: int
    ) -> list[TransactionCheck]:
        """Count one check of each ``due`` half message of ``topics`` (None: any topic, for
        the orphan sweep) up to ``max_count``, dropping those past the limit; returns the checks
        counted."""
        out: list[TransactionCheck] = []
        changed = False
        for start in range(0, len(due), 256):
            if len(out) >= max_count:
                break
            chunk = due[start : start + 256]
            raws = await self.commitlog.read([(h.phy_offset, h.size) for _, h in chunk])
            for (off, h), raw in zip(chunk, raws, strict=True):
                if not raw:
                    self.pending.pop(off, None)  # cleaned from the log: nothing to check
                    continue
                rec = decode_record(raw, check_crc=False)
                if h.real_topic is None:  # first read: where it goes, when it may be checked
                    h.real_topic = rec.properties.get(MessageConst.REAL_TOPIC, "")
                    immunity = _seconds(rec.properties.get(CHECK_IMMUNITY, ""))
                    if immunity and h.store_ms + immunity * 1000 > now:
                        h.next_check_ms = h.store_ms + immunity * 1000
                        continue
                if h.checks >= self.check_max:
                    async with self._resolving(off):
                        if not self._resolved(off):  # not ended meanwhile
                            log.warning(
                                "transaction %s of %s unresolved after %d checks: dropped",
                                TransactionId(off, h.phy_offset, h.size).encode(),
                                rec.properties.get(MessageConst.REAL_TOPIC, "?"),
                                h.checks,
                            )
                            uniq = rec.properties.get(MessageConst.UNIQ_KEY, "")
                            await self._resolve(off, "DISCARD", uniq)
                    continue
                if topics is not None and h.real_topic not in topics:
                    continue
                if topics is None and self._claimed_for.get(h.real_topic or "", -1) >= now - self.interval_ms:
                    continue  # a gateway has a producer of its topic: its claims count the checks
                if h.next_check_ms > now or off not in self.pending:
                    continue  # counted by a concurrent claim or sweep while this one read
                if len(out) >= max_count:
                    break
                h.checks += 1
                h.next_check_ms = now + self.interval_ms
                changed = True
                out.append(TransactionCheck(TransactionId(off, h.phy_offset, h.size).encode(), raw, h.checks))
        if changed:
            self._save()
        return out

    async def run_orphan_sweep(self, stop: asyncio.Event) -> None:
        """:meth:`sweep_orphans` every half ``transactionCheckInterval`` (0.2-5 s) until ``stop``."""
        period_s = min(5.0, max(0.2, self.interval_ms / 2000.0))
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await wait_within(stop.wait(), period_s)
            if stop.is_set():
                return
            try:
                await self.sweep_orphans()
            except NotMasterError:
                pass  # a SLAVE's dispatch: its master ends what it must
            except Exception as exc:  # the store unreachable: next round
                log.warning("transaction orphan sweep failed: %s", exc)

    def _save(self) -> None:
        """Persist the check counts of the pending half messages that were checked."""
        checked = sorted((k, h) for k, h in self.pending.items() if h.checks)
        body = "{" + ", ".join(f'"{k}": [{h.checks}, {h.next_check_ms}]' for k, h in checked) + "}"
        atomic_write(self.state_path, body.encode())


def _seconds(text: str) -> int:
    """A non-negative number of seconds from a property (0 when absent or not a number: the
    check runs on the usual schedule rather than fail the whole claim)."""
    try:
        return max(0, ascii_int(text))
    except ValueError:
        return 0
