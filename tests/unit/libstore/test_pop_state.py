"""PopState: deliveries, acks, invisible time, FIFO locking, and its journal: records folded into
a replica's state, snapshots, restarts and a cut log (the journal is a list here; the dispatch
service keeps it in the CommitLog)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libstore.consume_queue import BLANK_UNIT_SIZE, CqUnit
from libstore.errors import InvalidReceiptHandleError
from libstore.pop_state import LEGACY_JOURNAL_NAME, PopState, ReceiptHandle

T0 = 1_700_000_000_000


class Queue:
    """A stand-in ConsumeQueue: units 0..n-1, tags code = offset % 3."""

    def __init__(self, n: int) -> None:
        self.units = [CqUnit(i, 1000 * i, 100, i % 3) for i in range(n)]

    def read(self, offset: int, count: int) -> list[CqUnit]:
        return self.units[offset : offset + count]


def _pop(state: PopState, q: Queue, now: int, n: int = 10, **kw: object) -> list:  # type: ignore[type-arg]
    return state.pop(
        "g",
        "t",
        0,
        read_units=q.read,
        min_offset=0,
        max_offset=len(q.units),
        max_count=n,
        invisible_ms=kw.pop("invisible_ms", 1000),  # type: ignore[arg-type]
        now_ms=now,
        **kw,  # type: ignore[arg-type]
    )


class Log:
    """The journal as the CommitLog holds it: record bodies in order, each ending at a made-up
    CommitLog offset (100 bytes apiece)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def end_of(self, unit: int) -> int:
        return 100 * (unit + 1)

    def append_from(self, state: PopState) -> None:
        """What the master's journal does: append the records made, then read them back (the
        state holds them already: only its position moves)."""
        for record in state.take_records():
            self.bodies.append(record.body)
            unit = len(self.bodies) - 1
            assert not state.apply_record(record.body, self.end_of(unit), unit + 1)

    def replay_into(self, state: PopState) -> int:
        """Fold every record past the state's position into it; returns how many changed it."""
        changed = 0
        for unit in range(state.position.next_unit, len(self.bodies)):
            changed += state.apply_record(self.bodies[unit], self.end_of(unit), unit + 1)
        return changed


class Journaled(PopState):
    """A master's PopState whose operations are journaled into ``log`` as they happen."""

    def __init__(self, root: Path, log: Log, commits: dict) -> None:  # type: ignore[type-arg]
        super().__init__(root, commit_offset=lambda g, t, qid, o: commits.__setitem__((g, t, qid), o))
        self.log = log

    def pop(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = super().pop(*args, **kwargs)
        self.log.append_from(self)
        return out

    def ack(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().ack(*args, **kwargs)
        self.log.append_from(self)

    def change_invisible(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = super().change_invisible(*args, **kwargs)
        self.log.append_from(self)
        return out

    def finish(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = super().finish(*args, **kwargs)
        self.log.append_from(self)
        return out


def _open(root: Path, committed: dict | None = None, log: Log | None = None) -> Journaled:  # type: ignore[type-arg]
    """A state (re)started over ``root``: its newest snapshot, then the journal after it."""
    s = Journaled(root, log if log is not None else Log(), committed if committed is not None else {})
    s.load()
    s.log.replay_into(s)
    return s


def test_pop_ack_and_redelivery_after_invisible_time(tmp_path: Path) -> None:
    commits: dict = {}  # type: ignore[type-arg]
    s = _open(tmp_path, commits)
    q = Queue(5)
    first = _pop(s, q, T0, 3)
    assert [p.queue_offset for p in first] == [0, 1, 2] and {p.attempt for p in first} == {1}
    s.ack("g", "t", first[1].handle, T0 + 10)
    assert commits[("g", "t", 0)] == 0  # 0 is still in flight
    s.ack("g", "t", first[0].handle, T0 + 10)
    assert commits[("g", "t", 0)] == 2
    again = _pop(s, q, T0 + 500)  # 2 is invisible, 3 and 4 are new
    assert [p.queue_offset for p in again] == [3, 4]
    later = _pop(s, q, T0 + 1001)  # 2's time passed: attempt 2; 3, 4 are still invisible
    assert [(p.queue_offset, p.attempt) for p in later] == [(2, 2)]
    with pytest.raises(InvalidReceiptHandleError):  # the first handle of 2 was superseded
        s.ack("g", "t", first[2].handle, T0 + 1002)
    s.ack("g", "t", later[0].handle, T0 + 1002)
    s.ack("g", "t", later[0].handle, T0 + 1003)  # a retried ack is harmless
    with pytest.raises(InvalidReceiptHandleError):  # expired
        s.ack("g", "t", again[0].handle, T0 + 2000)


def test_change_invisible_gives_a_new_handle_and_a_later_redelivery(tmp_path: Path) -> None:
    s = _open(tmp_path)
    q = Queue(1)
    (p,) = _pop(s, q, T0)
    new = s.change_invisible("g", "t", p.handle, 5000, T0 + 100)
    assert new.visible_at == T0 + 5100 and new.seq != p.handle.seq
    with pytest.raises(InvalidReceiptHandleError):
        s.ack("g", "t", p.handle, T0 + 200)
    assert _pop(s, q, T0 + 2000) == []  # still invisible past the original 1 s
    (again,) = _pop(s, q, T0 + 5100)
    assert again.attempt == 2
    with pytest.raises(InvalidReceiptHandleError):
        ReceiptHandle.decode("garbage")


def test_in_flight_trusts_the_store_not_the_handle_text(tmp_path: Path) -> None:
    """What a dead-letter forward copies: the delivery as the store recorded it."""
    s = _open(tmp_path)
    q = Queue(3)
    first, second, _ = _pop(s, q, T0, 3)
    dead = s.in_flight("g", "t", first.handle, T0 + 10)
    assert (dead.queue_offset, dead.phy_offset, dead.size, dead.dead) == (0, 0, 100, True)
    forged = ReceiptHandle(0, 1, second.handle.seq, second.handle.visible_at, 1, 999_999, 4096)
    assert s.in_flight("g", "t", forged, T0 + 10).phy_offset == 1000  # not the handle's 999,999
    with pytest.raises(InvalidReceiptHandleError):  # another group never received it
        s.in_flight("other", "t", first.handle, T0 + 10)
    s.ack("g", "t", first.handle, T0 + 20)
    with pytest.raises(InvalidReceiptHandleError):  # already acked
        s.in_flight("g", "t", first.handle, T0 + 30)
    new = s.change_invisible("g", "t", second.handle, 5000, T0 + 40)
    with pytest.raises(InvalidReceiptHandleError):  # superseded
        s.in_flight("g", "t", second.handle, T0 + 50)
    assert s.in_flight("g", "t", new, T0 + 50).queue_offset == 1


def test_tag_filter_and_blank_units_finish_without_delivery(tmp_path: Path) -> None:
    commits: dict = {}  # type: ignore[type-arg]
    s = _open(tmp_path, commits)
    q = Queue(9)
    q.units[4] = CqUnit(4, 0, BLANK_UNIT_SIZE, 0)
    got = _pop(s, q, T0, 10, matches_code=lambda c: c == 1)
    assert [p.queue_offset for p in got] == [1, 7]  # 4 has code 1 but is blank
    for p in got:
        s.ack("g", "t", p.handle, T0 + 1)
    assert commits[("g", "t", 0)] == 9


def test_fifo_queue_is_locked_until_acked_and_redelivers_in_order(tmp_path: Path) -> None:
    s = _open(tmp_path)
    q = Queue(4)
    first = _pop(s, q, T0, 2, fifo=True)
    assert [p.queue_offset for p in first] == [0, 1]
    assert _pop(s, q, T0 + 10, fifo=True) == []  # locked
    s.ack("g", "t", first[0].handle, T0 + 20)
    assert _pop(s, q, T0 + 30, fifo=True) == []  # 1 still in flight
    again = _pop(s, q, T0 + 1001, fifo=True)  # 1 timed out: it comes back first, alone
    assert [(p.queue_offset, p.attempt) for p in again] == [(1, 2)]
    s.ack("g", "t", again[0].handle, T0 + 1002)
    assert [p.queue_offset for p in _pop(s, q, T0 + 1003, fifo=True)] == [2, 3]


def test_exhausted_messages_are_reported_dead(tmp_path: Path) -> None:
    s = _open(tmp_path)
    q = Queue(1)
    _pop(s, q, T0, max_attempts=2)
    (second,) = _pop(s, q, T0 + 1000, max_attempts=2)
    assert second.attempt == 2 and not second.dead
    assert s.expired(T0 + 1500, lambda g: 2) == []
    assert s.expired(T0 + 2000, lambda g: 3) == []  # one attempt left
    [(group, dead)] = s.expired(T0 + 2000, lambda g: 2)
    assert group == "g" and dead.queue_offset == 0
    assert s.finish("g", "t", 0, 0, dead.handle.seq)
    assert _pop(s, q, T0 + 3000) == [] and s.consumer_offset("g", "t", 0) == 1


def test_state_survives_a_restart_from_snapshot_and_journal(tmp_path: Path) -> None:
    log = Log()
    s = _open(tmp_path, log=log)
    q = Queue(6)
    got = _pop(s, q, T0, 4)
    s.snapshot()  # at the journal so far
    s.ack("g", "t", got[0].handle, T0 + 1)
    new = s.change_invisible("g", "t", got[1].handle, 9000, T0 + 2)
    # killed: the ack and the change are only in the journal, past the snapshot
    r = _open(tmp_path, log=log)
    assert r.consumer_offset("g", "t", 0) == 1
    with pytest.raises(InvalidReceiptHandleError):  # replaced by the change, also after the restart
        r.ack("g", "t", got[1].handle, T0 + 3)
    r.ack("g", "t", new, T0 + 3)  # the changed handle is the live one
    assert [p.queue_offset for p in _pop(r, q, T0 + 10)] == [4, 5]  # 2, 3 still invisible
    r.snapshot()
    again = _open(tmp_path, log=log)  # from the newer snapshot, nothing to replay
    assert again.position.next_unit == len(log.bodies)
    assert [(p.queue_offset, p.attempt) for p in _pop(again, q, T0 + 1500, 2)] == [(2, 2), (3, 2)]


def test_a_replica_folding_the_journal_holds_the_same_state(tmp_path: Path) -> None:
    """What a slave's dispatch does: apply the master's records in log order, then, promoted,
    carry on: acked messages stay acked, in-flight ones keep their handles."""
    log = Log()
    master_commits: dict = {}  # type: ignore[type-arg]
    master = _open(tmp_path / "m", master_commits, log)
    q = Queue(10)
    got = _pop(master, q, T0, 6)
    for p in got[:3]:
        master.ack("g", "t", p.handle, T0 + 5)
    changed = master.change_invisible("g", "t", got[4].handle, 60_000, T0 + 6)
    slave_commits: dict = {}  # type: ignore[type-arg]
    slave = PopState(
        tmp_path / "s", commit_offset=lambda g, t, qid, o: slave_commits.__setitem__((g, t, qid), o)
    )
    slave.load()
    assert log.replay_into(slave) == len(log.bodies)
    assert log.replay_into(slave) == 0  # applying the log twice changes nothing
    assert slave_commits == master_commits == {("g", "t", 0): 3}
    assert slave.seq == master.seq
    promoted = Journaled(tmp_path / "s", log, slave_commits)
    promoted.load()
    log.replay_into(promoted)
    promoted.ack("g", "t", got[3].handle, T0 + 7)  # a handle from the old master still works
    promoted.ack("g", "t", changed, T0 + 8)
    redelivered = _pop(promoted, q, T0 + 2000)  # 5 timed out, 6..9 are new; 0..4 are finished
    assert [(p.queue_offset, p.attempt) for p in redelivered] == [(5, 2), (6, 1), (7, 1), (8, 1), (9, 1)]
    assert slave_commits[("g", "t", 0)] == 5


def test_a_cut_journal_goes_back_to_a_snapshot_before_the_cut(tmp_path: Path) -> None:
    """A returning master's journal tail was never replicated: its state goes back to the newest
    snapshot at or before the cut and folds in what its successor wrote after it."""
    log = Log()
    s = _open(tmp_path, log=log)
    q = Queue(8)
    first = _pop(s, q, T0, 2)
    s.snapshot()
    cut_units = len(log.bodies)
    s.ack("g", "t", first[0].handle, T0 + 1)  # lost with the tail
    _pop(s, q, T0 + 2, 3)
    s.snapshot()  # taken past the cut: not usable after it
    del log.bodies[cut_units:]
    successor = _open(tmp_path / "other", log=log)
    successor.ack("g", "t", first[1].handle, T0 + 3)
    cut_end = log.end_of(cut_units - 1)
    assert s.discard_snapshots_after(cut_end) == 1  # the one taken past the cut describes lost records
    s.load(max_phy_end=cut_end)
    assert s.position.next_unit == cut_units
    log.replay_into(s)
    assert s.consumer_offset("g", "t", 0) == 0  # 0 in flight again, 1 acked by the successor
    again = _pop(s, q, T0 + 1001)
    assert [(p.queue_offset, p.attempt) for p in again][:2] == [(0, 2), (2, 1)]
    s.snapshot()
    restarted = _open(tmp_path, log=log)  # the newest snapshot now: the one after the cut
    assert restarted.position == s.position and restarted.seq == s.seq


def test_state_of_an_older_version_is_imported(tmp_path: Path) -> None:
    (tmp_path / LEGACY_JOURNAL_NAME).write_bytes(
        b'{"g":"g","t":"t","q":0,"o":3,"s":[[1,1000,100,1,1,1700000001000,7],[2,2000,100,2,1,1700000001000,8]]}\n'
        b'{"g":"g","t":"t","q":0,"o":3'  # torn
    )
    s = _open(tmp_path)
    assert s.consumer_offset("g", "t", 0) == 1 and s.seq == 8
    s.snapshot()
    s.retire_legacy()
    assert not (tmp_path / LEGACY_JOURNAL_NAME).exists()
    assert _open(tmp_path).consumer_offset("g", "t", 0) == 1


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["pop", "ack", "tick", "reopen", "snapshot", "failover"]), st.integers(0, 7)
        ),
        max_size=40,
    )
)
def test_every_message_is_delivered_until_acked(tmp_path_factory: pytest.TempPathFactory, ops: list) -> None:  # type: ignore[type-arg]
    """Model: whatever the interleaving of pops, acks, time, snapshots, restarts and failovers
    to a replica that folded the journal, a message is never delivered after its ack, and every
    unacked message is deliverable once its time passes."""
    root = tmp_path_factory.mktemp("pop")
    log = Log()
    s = _open(root, log=log)
    replicas = 0
    q = Queue(8)
    now = T0
    live: dict[int, ReceiptHandle] = {}
    acked: set[int] = set()
    for op, arg in ops:
        if op == "pop":
            for p in _pop(s, q, now, arg + 1):
                assert p.queue_offset not in acked
                live[p.queue_offset] = p.handle
        elif op == "ack" and live:
            offset = sorted(live)[arg % len(live)]
            handle = live.pop(offset)
            if handle.visible_at > now:
                s.ack("g", "t", handle, now)
                acked.add(offset)
        elif op == "tick":
            now += 600
        elif op == "reopen":
            s = _open(root, log=log)
        elif op == "snapshot":
            s.snapshot()
        elif op == "failover":  # a replica that followed the journal takes over
            replicas += 1
            root = tmp_path_factory.mktemp(f"replica{replicas}")
            s = _open(root, log=log)
    now += 10_000
    rest = {p.queue_offset for p in _pop(s, q, now, 8)}
    assert rest == set(range(8)) - acked
