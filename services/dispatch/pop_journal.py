"""PopJournal: the pop state's journal in the CommitLog, on the dispatch service.

libstore.pop_state changes its state in memory and makes one journal record per operation; this
class is the rest of the loop (see the PopState module docstring for the record format):

* **Writing** (the master's dispatch): :meth:`commit` hands the records made since the last call
  to one appender task, which appends whatever is waiting as one batch (group commit: one
  CommitLog append for many operations, in the order they were made; an operation that finds
  the appender idle and nothing queued appends its own records at once), then resolves each
  waiter once its records are appended and as durable as the log's policy makes any put
  (flushed under SYNC_FLUSH, held by a slave under SYNC_MASTER). An operation answers its
  caller only then. An ack must be as durable as a put (flushed under SYNC_FLUSH, held by a
  slave under SYNC_MASTER) before it is answered, so an ack the client saw succeed survives a
  failover: a put status short of PUT_OK (SLAVE_NOT_AVAILABLE, a flush or slave timeout) fails
  it (the records are in the log all the same), and an ack that changes nothing (a retry)
  waits until the records before it are that durable. Receives, changes of invisible time and
  dead-letter finishes are answered on any status (losing one only means a delivery comes
  again), so consumption goes on while a SYNC_MASTER has no slave. The appends carry the master term the
  state was read under (``expected_epoch``): a store that stopped being that master refuses them.
* **Reading** (every replica's dispatch): a reader task follows the journal topic's
  ConsumeQueue (``rmq_sys_pop_journal`` queue 0; tags code = the record's seq) and folds each
  record into the state (:meth:`PopState.apply_record`); on the master most are its own, which
  the state already holds, and are passed over by their tags code without a read.
* **Terms**: before serving, the journal learns the master term and waits until the state
  folded in every record the log held at that moment (a promoted slave first catches up with
  what its old master wrote; a restarted dispatch with what it wrote before it died), so a new
  record's seq is past every seq in the log. A slave's dispatch refuses operations
  (NotMasterError). (A dispatch restarted under a SYNC_MASTER that has no slave waits until
  one returns: what its predecessor journaled since is not confirmed, so not yet readable.)
* **Failures**: an append that fails leaves the state ahead of the log; the state is then
  reloaded (newest snapshot + the journal after it; seqs handed out before are never reused)
  and the operations fail (ServiceNotAvailableError, or NotMasterError): clients retry. When the
  log is cut under the dispatch service (or found shorter at start), the state goes back to a
  snapshot taken before the cut and the snapshots past it are deleted (:meth:`rollback`).
  Any replacement of the state voids what was made from the old one (a generation number).
* **Snapshots** every ``snapshot_every`` records folded or passed over, and at close: new
  operations wait while the appender drains and the reader catches up, so the snapshot holds
  exactly the journal up to its position.

Runs on the dispatch service's event loop (``rollback`` may come from another thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from libstore import Message, PutMessageStatus
from libstore.aio_deadline import wait_within
from libstore.consume_queue import BLANK_UNIT_SIZE, CqUnit
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.errors import NotMasterError, ServiceNotAvailableError, StoreError
from libstore.pop_state import JournalRecord, PopState
from libstore.record_codec import decode_record
from libstore.system_topics import POP_JOURNAL_TOPIC, POP_SEQ
from services.ports import CommitLogPort

log = logging.getLogger(__name__)

READ_BATCH = 1024
POLL_S = 0.05
CATCH_UP_TIMEOUT_S = 30.0
SNAPSHOT_EVERY = 10_000


class _Pending:
    __slots__ = ("durable", "epoch", "future", "generation", "records")

    def __init__(
        self,
        records: list[JournalRecord],
        future: asyncio.Future[None],
        epoch: int,
        generation: int,
        durable: bool,
    ) -> None:
        self.records = records
        self.future = future
        self.epoch = epoch
        self.generation = generation
        self.durable = durable


class PopJournal:
    """The journal of ``state`` through ``commitlog``, read back from ``queues`` (see module
    docstring). ``reput_offset()`` gives how far the dispatch service applied the log (it
    applies confirmed bytes only)."""

    def __init__(
        self,
        state: PopState,
        queues: ConsumeQueueStore,
        commitlog: CommitLogPort,
        reput_offset: Callable[[], int],
        *,
        snapshot_every: int = SNAPSHOT_EVERY,
    ) -> None:
        self.state = state
        self.queues = queues
        self.commitlog = commitlog
        self.reput_offset = reput_offset
        self.snapshot_every = snapshot_every
        self._pending: list[_Pending] = []
        self._appending = False  # an append is under way (the appender's or a caller's own)
        self._work = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()  # cleared while a snapshot is taken
        self._open.set()
        self._arrived = asyncio.Event()
        self._term: tuple[int, int] | None = None  # (epoch, start): the state serves this master term
        self._reload = False  # the state is ahead of the log (an append failed): reload it
        self._rollback_lock = threading.Lock()
        self._rollback_to: int | None = None
        self._generation = 0  # bumped whenever the state is replaced: what came from the old one is void
        self._issued_seq = 0  # the highest seq handed to the appender by this process
        self._last_appended_end = 0
        self._undurable_end = 0  # end of the records appended with a put status short of PUT_OK
        self._since_snapshot = 0
        self._tasks: list[asyncio.Task[None]] = []

    # -- life -------------------------------------------------------------------------------------
    def load(self) -> None:
        """Load the newest snapshot (the reader applies the journal after it once started)."""
        self.state.load()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._append_loop(), name="pop-journal-append"),
            loop.create_task(self._read_loop(), name="pop-journal-read"),
        ]

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop; first snapshot the state if everything made was appended and read back."""
        with contextlib.suppress(Exception):
            await wait_within(self._snapshot(), timeout_s)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self._fail(self._pending, ServiceNotAvailableError("the dispatch service is stopping"))
        self._pending = []

    def wake(self) -> None:
        """The journal queue grew (called on arrival, on the loop). Units that are all this
        process's own records (the state holds them: every ack and receive makes one) are
        passed over here and then, without waking the reader task for each; it wakes for
        records made elsewhere, a state being replaced, or a snapshot that is due."""
        if self._term is not None and self._rollback_to is None and not self._reload:
            # (No term: a slave's, or one catching up; its units are others' records.)
            units = self._new_units()
            seq = self.state.seq
            if len(units) < READ_BATCH and not any(
                u.size != BLANK_UNIT_SIZE and u.tags_code > seq for u in units
            ):
                self._fold(units, {})
                if self._since_snapshot < self.snapshot_every:
                    return
        self._arrived.set()

    def rollback(self, log_end: int) -> None:
        """The log was cut at ``log_end``, or ends there at start (any thread): the state goes
        back to a snapshot taken at or before it, before the next operation or read."""
        with self._rollback_lock:
            self._rollback_to = log_end if self._rollback_to is None else min(self._rollback_to, log_end)

    # -- serving ----------------------------------------------------------------------------------
    async def ready(self) -> None:
        """Wait until operations may change the state: this store is the master, the state
        holds every record the log held when its term was checked, no snapshot is being taken.
        Raises NotMasterError on a slave, ServiceNotAvailableError when the state does not
        catch up within ``CATCH_UP_TIMEOUT_S``."""
        while True:
            self._apply_rollback()
            if self._reload:
                self._reload_state()
            await self._open.wait()
            if self._term is not None and not self._reload and self._rollback_to is None:
                return
            offsets = await self.commitlog.offsets()
            if offsets.broker_role == "SLAVE":
                raise NotMasterError("this dispatch service follows a SLAVE: pop from the master")
            generation = self._generation
            await self._catch_up(offsets.max_offset)
            if generation == self._generation and not self._reload and self._rollback_to is None:
                self._term = (offsets.epoch, offsets.epoch_start)
                return
            # the state was replaced while catching up: check again

    async def _catch_up(self, offset: int) -> None:
        """Wait until the state folded in every journal record before CommitLog ``offset``."""
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while True:
            self._apply_rollback()
            if self.reput_offset() >= offset:
                cq = self.queues.find(POP_JOURNAL_TOPIC, 0)
                if cq is None or self.state.position.next_unit >= cq.max_offset_in_queue:
                    return
                self._arrived.set()
            if time.monotonic() > deadline:
                raise ServiceNotAvailableError(
                    f"the pop state is still catching up with the CommitLog (at {self.reput_offset()}, "
                    f"needs {offset}); retry"
                )
            await asyncio.sleep(POLL_S)

    async def commit(self, *, durable: bool = False) -> None:
        """Append the records the state made since the last call and wait until they are in
        the log; with ``durable`` (an ack), until they are as durable as a put with PUT_OK, and
        when there are none, until the records before are. Raises NotMasterError or
        ServiceNotAvailableError."""
        records = self.state.take_records()
        if not records:
            if durable:
                await self._wait_durable()
            return
        self._issued_seq = max(self._issued_seq, records[-1].seq)
        if self._term is None or self._reload:
            raise ServiceNotAvailableError("the pop state is being reloaded from the log; retry")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending = _Pending(records, future, self._term[0], self._generation, durable)
        self._idle.clear()
        if self._appending or self._pending:
            self._pending.append(pending)
            self._work.set()
        else:
            await self._append_here(pending)
        await future

    async def _append_here(self, pending: _Pending) -> None:
        """Append a lone operation's records from its caller's task, the appender being idle:
        handing them to the appender costs two task switches, and the followers that the
        append wakes then run before the caller answers. Operations made meanwhile queue for
        the appender, which goes on with them once this one is done (``_appending``). A caller
        cancelled inside the append (a client gone) leaves it unknown whether the records are
        in the log (a remote commitlog's call may or may not have arrived): the state is then
        reloaded from the log, as after a failed append."""
        self._appending = True
        try:
            await self._append([pending])
        except asyncio.CancelledError:
            if not pending.future.done():
                self._lost([], ServiceNotAvailableError("a pop journal append was cancelled"))
                pending.future.cancel()
            raise
        finally:
            self._appending = False
            if self._pending:
                self._work.set()
            else:
                self._idle.set()

    async def _wait_durable(self) -> None:
        """Wait until the records appended short of PUT_OK are confirmed (dispatch reads only
        confirmed bytes: flushed under SYNC_FLUSH, on a slave under SYNC_MASTER)."""
        end = self._undurable_end
        if not end:
            return
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while self.reput_offset() < end:
            if time.monotonic() > deadline:
                raise ServiceNotAvailableError("earlier acks are not replicated yet; retry")
            await asyncio.sleep(POLL_S)
        if self._undurable_end == end:
            self._undurable_end = 0

    # -- appender -----------------------------------------------------------------------------------
    async def _append_loop(self) -> None:
        while True:
            await self._work.wait()
            self._work.clear()
            if self._appending:  # a caller appends its own records; it wakes this loop after
                continue
            batch, self._pending = self._pending, []
            if not batch:
                self._idle.set()
                continue
            self._appending = True
            try:
                await self._append(batch)
            finally:
                self._appending = False
            if not self._pending:
                self._idle.set()

    @staticmethod
    def _fail(batch: list[_Pending], error: BaseException) -> None:
        for p in batch:
            if not p.future.done():
                p.future.set_exception(error)

    async def _append(self, batch: list[_Pending]) -> None:
        live = [p for p in batch if p.generation == self._generation]
        self._fail(
            [p for p in batch if p.generation != self._generation],
            ServiceNotAvailableError("the pop state was reloaded from the log meanwhile; retry"),
        )
        if not live:
            return
        records = [r for p in live for r in p.records]
        messages = [Message(POP_JOURNAL_TOPIC, r.body, 0, properties={POP_SEQ: str(r.seq)}) for r in records]
        error: StoreError | None = None
        try:
            results = await self.commitlog.append(messages, expected_epoch=live[0].epoch)
            if results.appended < len(messages):
                error = ServiceNotAvailableError(f"pop state not journaled: {results.failed_status.name}")
        except NotMasterError as exc:
            error = exc
        except StoreError as exc:
            error = ServiceNotAvailableError(f"pop state not journaled: {exc}")
        except Exception as exc:  # a transport error: the records may or may not be in the log
            error = ServiceNotAvailableError(f"pop state not journaled: {exc}")
        if error is not None:
            self._lost(live, error)
            return
        end = results.phy_offsets[-1] + results.sizes[-1]
        self._last_appended_end = end
        if results.status is PutMessageStatus.PUT_OK:
            self._undurable_end = 0  # durable up to here, what came before included
            short = None
        else:
            self._undurable_end = end
            short = ServiceNotAvailableError(
                f"ack journaled with {results.status.name}, not durable yet; retry"
            )
        for p in live:
            if p.future.done():
                continue
            if p.durable and short is not None:
                p.future.set_exception(short)
            else:
                p.future.set_result(None)

    def _lost(self, batch: list[_Pending], error: StoreError) -> None:
        """An append of ``batch`` failed or ended unknown: the state may be ahead of the log,
        so it is reloaded from the log; the batch and everything queued fail with ``error``."""
        log.warning("pop journal append failed (%s); reloading the pop state from the log", error)
        self._term = None
        self._reload = True
        self._fail([*batch, *self._pending], error)
        self._pending = []

    def _reload_state(self) -> None:
        """Replace the state by the newest snapshot; the reader applies the journal after it."""
        self._reload = False
        self._generation += 1
        self.state.load()
        self.state.reserve_seqs_through(self._issued_seq)  # failed appends may have landed after all
        log.info("pop state reloaded at journal unit %d", self.state.position.next_unit)

    def _apply_rollback(self) -> None:
        with self._rollback_lock:
            cut, self._rollback_to = self._rollback_to, None
        if cut is None:
            return
        self._generation += 1
        self._term = None
        self._reload = False
        dropped = self.state.discard_snapshots_after(cut)
        self.state.load(max_phy_end=cut)
        self._last_appended_end = min(self._last_appended_end, cut)
        self._undurable_end = 0
        log.warning(
            "pop state back at journal unit %d (CommitLog offset %d): the log ends at %d "
            "(%d later snapshots dropped)",
            self.state.position.next_unit,
            self.state.position.phy_end,
            cut,
            dropped,
        )

    # -- reader -----------------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        while True:
            try:
                self._apply_rollback()
                if self._reload and self._idle.is_set():
                    self._reload_state()
                moved = await self._read_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pop journal read failed; retrying")
                moved = 0
            if self._since_snapshot >= self.snapshot_every:
                with contextlib.suppress(Exception):
                    await self._snapshot()
            if not moved:
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await wait_within(self._arrived.wait(), POLL_S * 4)

    async def _read_once(self) -> int:
        """Fold in (or pass over) the journal units past the state's position; returns how many."""
        units = self._new_units()
        if not units:
            return 0
        state = self.state
        generation = self._generation
        position = state.position.next_unit
        wanted = [u for u in units if u.size != BLANK_UNIT_SIZE and u.tags_code > state.seq]
        raws = await self.commitlog.read([(u.phy_offset, u.size) for u in wanted]) if wanted else []
        if generation != self._generation or self._rollback_to is not None:
            return 0  # the state was replaced (or is about to be) while reading
        if state.position.next_unit != position:
            return 0  # wake() passed units over meanwhile: read again from where it left them
        self._fold(units, {u.queue_offset: raw for u, raw in zip(wanted, raws, strict=True)})
        return len(units)

    def _new_units(self) -> list[CqUnit]:
        """Up to READ_BATCH journal units past the state's position (none while the queue
        does not exist yet)."""
        cq = self.queues.find(POP_JOURNAL_TOPIC, 0)
        if cq is None:
            return []
        start = max(self.state.position.next_unit, cq.min_offset_in_queue)
        end = cq.max_offset_in_queue
        if start >= end:
            return []
        return cq.read_units(start, min(READ_BATCH, end - start))

    def _fold(self, units: list[CqUnit], bodies: dict[int, bytes | None]) -> None:
        """Apply ``units``: the records read (``bodies`` by queue offset), the rest passed over
        (this process's own records, which the state holds already, blanks, records gone)."""
        state = self.state
        for u in units:
            raw = bodies.get(u.queue_offset)
            end_offset = u.phy_offset + u.size
            if raw:
                try:
                    state.apply_record(
                        decode_record(raw, check_crc=False).body, end_offset, u.queue_offset + 1
                    )
                except (StoreError, ValueError) as exc:
                    log.error(
                        "pop journal unit %d is not a journal record (%s): passed over", u.queue_offset, exc
                    )
                    state.skip_record(end_offset, u.queue_offset + 1)
            else:
                state.skip_record(
                    end_offset if u.size != BLANK_UNIT_SIZE else state.position.phy_end, u.queue_offset + 1
                )
        self._since_snapshot += len(units)

    # -- snapshots ------------------------------------------------------------------------------------
    async def _snapshot(self) -> None:
        """Pause new operations, let the appender drain and the reader catch up with it, save.
        Nothing is saved while the state waits to be reloaded or rolled back, and a snapshot
        whose state was replaced while it was written is deleted again."""
        self._open.clear()
        try:
            await self._idle.wait()
            deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
            while self.state.position.phy_end < self._last_appended_end:
                if await self._read_once() == 0:
                    if time.monotonic() > deadline:
                        return  # the appended records are not confirmed yet: try later
                    await asyncio.sleep(POLL_S)
            if self._reload or self._rollback_to is not None:
                return
            generation = self._generation
            phy_end, data = self.state.snapshot_bytes()
            folded = self._since_snapshot  # units passed over while it is written count for the next
            path = await asyncio.to_thread(self.state.write_snapshot, phy_end, data)
            if generation != self._generation:  # replaced meanwhile: this one may describe a cut log
                path.unlink(missing_ok=True)
                return
            self.state.retire_legacy()
            self._since_snapshot = max(0, self._since_snapshot - folded)
        finally:
            self._open.set()
