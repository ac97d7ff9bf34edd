"""The gateway's routing over a broker group (services.gateway.broker_group), with in-memory
members: writes follow the master, reads fall back to whoever answers, slave reads for records
far behind the master's end, consumer offsets kept on every member."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from libstore import NotMasterError, PutMessageResults, ServiceNotAvailableError
from services.gateway.broker_group import BrokerGroup, GroupCommitLog, GroupDispatch, Member
from services.ports import LogOffsets


class FakeLog:
    """A member's commitlog: a role, a log (offset -> bytes), a switch to make it unreachable."""

    def __init__(self, name: str, role: str, epoch: int, records: dict[int, bytes]) -> None:
        self.name, self.role, self.epoch, self.records = name, role, epoch, records
        self.down = False
        self.appends: list[bytes] = []
        self.reads: list[list[tuple[int, int]]] = []

    def _check(self) -> None:
        if self.down:
            raise ServiceNotAvailableError(f"{self.name} is down")

    async def offsets(self) -> LogOffsets:
        self._check()
        end = max(self.records, default=0) + 10
        return LogOffsets(0, end, end, end, "ASYNC_FLUSH", self.role, 1 << 20, epoch=self.epoch)

    async def append_records(self, raw: bytes, born_host: str = "") -> PutMessageResults:
        self._check()
        if self.role == "SLAVE":
            raise NotMasterError(f"{self.name} is a SLAVE")
        self.appends.append(raw)
        return PutMessageResults(1)

    async def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        self._check()
        self.reads.append(list(ranges))
        return [self.records.get(o) for o, _ in ranges]


class FakeDispatch:
    def __init__(self) -> None:
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.down = False

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if self.down:
            raise ServiceNotAvailableError("down")
        self.offsets[(group, topic, queue_id)] = offset

    async def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        if self.down:
            raise ServiceNotAvailableError("down")
        return self.offsets.get((group, topic, queue_id), -1)


def _group(**kwargs: object) -> tuple[BrokerGroup, FakeLog, FakeLog, FakeDispatch, FakeDispatch]:
    a = FakeLog("a", "SYNC_MASTER", 1, {0: b"r0", 100: b"r100"})
    b = FakeLog("b", "SLAVE", 1, {0: b"r0"})  # behind: lacks the record at 100
    da, db = FakeDispatch(), FakeDispatch()
    members = [Member("a", a, da, None), Member("b", b, db, None)]  # type: ignore[arg-type]
    return BrokerGroup(members, refresh_s=0.0, **kwargs), a, b, da, db  # type: ignore[arg-type]


def test_writes_follow_the_master_across_a_switch():
    group, a, b, _, _ = _group()
    log = GroupCommitLog(group)

    async def run() -> None:
        await log.append_records(b"one")
        assert a.appends == [b"one"]
        a.role, b.role, b.epoch = "SLAVE", "ASYNC_MASTER", 2  # a promotion happened elsewhere
        await log.append_records(b"two")  # NOT_MASTER from a, then b after a refresh
        assert b.appends == [b"two"]
        b.down = True
        a.role = "SLAVE"
        with pytest.raises(ServiceNotAvailableError, match="no master"):
            await log.append_records(b"three")

    asyncio.run(run())


def test_reads_fall_back_and_fill_what_a_member_lacks():
    group, a, b, _, _ = _group()
    log = GroupCommitLog(group)

    async def run() -> None:
        assert await log.read([(0, 0), (100, 0)]) == [b"r0", b"r100"]
        assert a.reads and not b.reads  # the master answers first
        a.down = True  # the master is gone: the slave serves what it has
        assert await log.read([(0, 0), (100, 0)]) == [b"r0", None]

    asyncio.run(run())


def test_slave_read_for_records_far_behind_the_master():
    group, a, b, _, _ = _group(slave_read_enable=True, slave_read_lag_bytes=50)
    log = GroupCommitLog(group)

    async def run() -> None:
        assert await log.read([(0, 0)]) == [b"r0"]  # 110 bytes behind the end: the slave first
        assert b.reads == [[(0, 0)]] and not a.reads
        assert await log.read([(100, 0)]) == [b"r100"]  # near the end: the master
        assert a.reads == [[(100, 0)]]

    asyncio.run(run())


def test_consumer_offsets_on_every_member():
    group, _, _, da, db = _group()
    dispatch = GroupDispatch(group)

    async def run() -> None:
        await dispatch.commit_offset("g", "T", 0, 5)
        assert da.offsets == db.offsets == {("g", "T", 0): 5}
        da.down = True  # the master's dispatch is gone: progress goes on on the slave's
        await dispatch.commit_offset("g", "T", 0, 9)
        da.down = False
        assert await dispatch.query_offset("g", "T", 0) == 9  # the highest wins
        da.down = db.down = True
        with pytest.raises(ServiceNotAvailableError):
            await dispatch.commit_offset("g", "T", 0, 10)

    asyncio.run(run())
