"""services.dispatch.timer.TimerService over real timer-queue units and a CommitLogPort stand-in
that appends to a real log: due messages go out in delivery-time order, a refused one is dropped
without holding up the others, a failed read or append is retried, and neither a restart nor a
replica's timer delivers anything twice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from libstore import CommitLog, Message, PutMessageResults, StoreConfig, TopicNotFoundError
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.errors import ServiceNotAvailableError
from libstore.record_codec import check_record
from libstore.system_topics import TIMER_DELIVER_MS, TIMER_DONE_TOPIC
from services.dispatch.timer import TimerService


class Port:
    """read() from a real CommitLog; append() puts messages into it and dispatches them into
    ``cqs`` (as the dispatch service would), refusing topic "Gone" and, while ``down``, every
    append. ``appended``: the delivered copies (timer-done records left out)."""

    def __init__(self, log: CommitLog, cqs: ConsumeQueueStore) -> None:
        self.log = log
        self.cqs = cqs
        self.appended: list[Message] = []
        self.down = False
        self.read_fails = False

    async def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        if self.read_fails:
            raise ServiceNotAvailableError("commitlog unreachable")
        return self.log.read_many(ranges)

    async def append(self, messages: Sequence[Message], *, expected_epoch: int = 0) -> PutMessageResults:
        if self.down:
            raise ServiceNotAvailableError("down")
        if any(m.topic == "Gone" for m in messages):
            raise TopicNotFoundError("topic Gone does not exist")
        start = self.log.max_offset
        results = self.log.put_messages(messages)
        _dispatch(self.log, self.cqs, start)
        self.appended += [m for m in messages if m.topic != TIMER_DONE_TOPIC]
        return results


def _dispatch(log: CommitLog, cqs: ConsumeQueueStore, start: int) -> None:
    raw, _ = log.read_chunk(start, log.max_offset, log.max_offset)
    pos, reqs = 0, []
    while pos < len(raw):
        reqs.append(check_record(raw, pos, len(raw)))
        pos += reqs[-1].msg_size
    cqs.dispatch_batch(reqs)


def _setup(root: Path, now: int) -> tuple[CommitLog, ConsumeQueueStore]:
    config = StoreConfig(
        store_path_root_dir=str(root), mapped_file_size_commit_log=1 << 20, max_message_size=65536
    )
    log = CommitLog.open(config)
    at = {"a": now + 300, "b": now + 100, "gone": now + 150, "c": now + 200, "later": now + 10_000_000}
    msgs = [
        Message(
            "Gone" if name == "gone" else "Orders", name.encode(), 0, properties={TIMER_DELIVER_MS: str(t)}
        )
        for name, t in at.items()
    ]
    assert log.put_messages(msgs).all_ok
    cqs = ConsumeQueueStore(root / "cq", 6000)
    _dispatch(log, cqs, 0)
    return log, cqs


def test_due_messages_in_time_order_bad_ones_dropped_failures_retried(tmp_path: Path) -> None:
    now = time.time_ns() // 1_000_000  # the put holds them (timer topic) against the real clock
    log, cqs = _setup(tmp_path / "store", now)
    clock = [now]
    port = Port(log, cqs)
    timer = TimerService(tmp_path / "dispatch", cqs, port, clock=lambda: clock[0])  # type: ignore[arg-type]
    timer.load()

    async def scenario() -> None:
        assert await timer.tick() == 0 and timer.pending == 5  # nothing due yet
        clock[0] = now + 150
        port.read_fails = True  # the log unreachable while reading due messages: nothing is lost
        try:
            await timer.tick()
            raise AssertionError("a failed read must be reported")
        except ServiceNotAvailableError:
            pass
        assert timer.pending == 5
        port.read_fails = False
        port.down = True
        try:
            await timer.tick()
            raise AssertionError("a failed append must be reported")
        except ServiceNotAvailableError:
            pass
        assert timer.pending == 5  # held again
        port.down = False
        assert await timer.tick() == 1  # b; "gone" refused for good and dropped, not retried
        assert [m.body for m in port.appended] == [b"b"]
        clock[0] = now + 400
        assert await timer.tick() == 2
        assert [m.body for m in port.appended] == [b"b", b"c", b"a"]
        assert all(m.topic == "Orders" and m.queue_id == 0 for m in port.appended)

    asyncio.run(scenario())
    # A restart (new service over the same folder) holds only the one not delivered.
    again = TimerService(tmp_path / "dispatch", cqs, port, clock=lambda: now + 400)  # type: ignore[arg-type]
    again.load()
    assert asyncio.run(again.tick()) == 0 and again.pending == 1
    assert again.next_due() == now + 10_000_000
    # A replica's timer (another dispatch pod: no checkpoint of its own) learns the same from the
    # timer-done records in the log: after a promotion it delivers nothing twice.
    replica = TimerService(tmp_path / "replica", cqs, port, clock=lambda: now + 400)  # type: ignore[arg-type]
    replica.load()
    assert asyncio.run(replica.tick()) == 0 and replica.pending == 1
    assert [m.body for m in port.appended] == [b"b", b"c", b"a"]
    log.shutdown()
