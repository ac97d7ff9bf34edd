"""BrokerGroup: the gateway's view of one broker group (a master and its slaves), and ports that
route over it, so the GatewayServicer keeps talking to one CommitLogPort, DispatchPort and
IndexPort.

Each member is a commitlog service with its own dispatch and index (a slave builds its
ConsumeQueues and IndexFiles from its own, byte-identical log, so physical and queue offsets mean
the same on every member). The members' roles and epochs come from their ``offsets()``
(refreshed every ``refresh_s`` seconds, and at once after a NOT_MASTER or an unreachable member).

Routing (RocketMQ's broker / slave-read rules over our services):
* writes (append, topic changes) go to the master of the newest epoch; NOT_MASTER or an
  unreachable master triggers one refresh and one retry on the new master. Appends are safe to
  resend: the new master refilled its de-duplication window from the log when it was promoted.
* reads try the master's member first and fall back to the others when it is unreachable
  (RocketMQ's slave read while the master is down); a record a member does not hold (yet) is
  read from the next one. With ``slave_read_enable``, records further behind the master's end
  than ``slave_read_lag_bytes`` (RocketMQ: accessMessageInMemoryMaxRatio of RAM) are read from a
  slave first, to keep cold reads off the master's page cache.
* consumer offsets are committed to every reachable member (the master's is the reference;
  a slave's keeps progress made while the master is down) and read as the highest of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from libstore import (
    BrokerRole,
    NotMasterError,
    PutMessageResults,
    ServiceNotAvailableError,
    StoreError,
    TopicConfig,
)
from libstore.consume_queue import BoundaryType
from libstore.consumer_offset_manager import QueueProgress
from libstore.message import MessageFields
from libstore.record_framing import frame_records
from libstore.subscription_group import SubscriptionGroupConfig
from services.ports import (
    CommitLogPort,
    DerivedStatus,
    DispatchPort,
    Entries,
    IndexPort,
    LogOffsets,
    PopResult,
    QueueInfo,
    TailChunk,
    TransactionCheck,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
DOWN_FOR_S = 1.0


def _unreachable(exc: BaseException) -> bool:
    """The member did not answer (not a business error)."""
    if isinstance(exc, grpc.RpcError):
        return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    return isinstance(exc, ServiceNotAvailableError) and not isinstance(exc, NotMasterError)


@dataclass
class Member:
    """One commitlog service with its dispatch and index; ``name`` labels logs."""

    name: str
    commitlog: CommitLogPort
    dispatch: DispatchPort
    index: IndexPort
    probe: CommitLogPort | None = None  # short-deadline port for role probes (default: commitlog)
    role: str = ""
    epoch: int = 0
    max_offset: int = 0
    down_until: float = 0.0

    @property
    def is_master(self) -> bool:
        return self.role in (BrokerRole.ASYNC_MASTER.value, BrokerRole.SYNC_MASTER.value)

    @property
    def up(self) -> bool:
        return time.monotonic() >= self.down_until

    def mark_down(self) -> None:
        self.down_until = time.monotonic() + DOWN_FOR_S


class BrokerGroup:
    """The members of one broker group (see module docstring)."""

    def __init__(
        self,
        members: Sequence[Member],
        *,
        refresh_s: float = 2.0,
        slave_read_enable: bool = False,
        slave_read_lag_bytes: int = 0,
    ) -> None:
        if not members:
            raise ValueError("a broker group has at least one member")
        self.members = list(members)
        self.refresh_s = refresh_s
        self.slave_read_enable = slave_read_enable
        self.slave_read_lag_bytes = slave_read_lag_bytes
        self._refreshed = 0.0
        self._refreshing: asyncio.Task[None] | None = None

    # -- roles ------------------------------------------------------------------------------------
    async def refresh(self) -> None:
        """Ask every member for its role, epoch and log end (concurrently, one at a time)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        async def one(m: Member) -> None:
            try:
                o: LogOffsets = await (m.probe or m.commitlog).offsets()
            except (StoreError, grpc.RpcError) as exc:
                if _unreachable(exc):
                    m.mark_down()
                    m.role = ""
                return
            m.role, m.epoch, m.max_offset, m.down_until = o.broker_role, o.epoch, o.max_offset, 0.0

        await asyncio.gather(*(one(m) for m in self.members))
        self._refreshed = time.monotonic()

    async def _fresh(self) -> None:
        if time.monotonic() - self._refreshed > self.refresh_s:
            await self.refresh()

    async def master(self) -> Member:
        """The reachable master of the newest epoch; raises ServiceNotAvailableError."""
        await self._fresh()
        best = self._best_master()
        if best is None:
            await self.refresh()
            best = self._best_master()
        if best is None:
            raise ServiceNotAvailableError("no master of this broker group is reachable")
        return best

    def _best_master(self) -> Member | None:
        masters = [m for m in self.members if m.is_master and m.up]
        return max(masters, key=lambda m: m.epoch) if masters else None

    async def readers(self) -> list[Member]:
        """Members in read order: the master (if known), then the others by log end; members
        marked down go last."""
        await self._fresh()
        ordered = sorted(self.members, key=lambda m: (not m.up, not m.is_master, -m.max_offset))
        return ordered

    # -- calls ------------------------------------------------------------------------------------
    async def on_master(self, fn: Callable[[Member], Awaitable[T]]) -> T:
        """``fn(master)``; after NOT_MASTER or an unreachable master, once more on the master
        found by a refresh (if it is another member)."""
        member = await self.master()
        try:
            return await fn(member)
        except (StoreError, grpc.RpcError) as exc:
            if not (isinstance(exc, NotMasterError) or _unreachable(exc)):
                raise
            if _unreachable(exc):
                member.mark_down()
            member.role = ""
            await self.refresh()
            again = self._best_master()
            if again is None or again is member:
                raise
            log.warning("%s is no longer the master; retrying on %s", member.name, again.name)
            return await fn(again)

    async def on_reader(self, fn: Callable[[Member], Awaitable[T]]) -> T:
        """``fn`` on the first member that answers, in read order."""
        last: BaseException | None = None
        for member in await self.readers():
            try:
                return await fn(member)
            except (StoreError, grpc.RpcError) as exc:
                if not _unreachable(exc):
                    raise
                member.mark_down()
                last = exc
        assert last is not None
        raise last

    async def on_all(self, fn: Callable[[Member], Awaitable[T]]) -> list[T]:
        """``fn`` on every member at once; the results of those that answered. Raises the
        first error when none did."""
        results = await asyncio.gather(*(fn(m) for m in self.members), return_exceptions=True)
        ok = [r for r in results if not isinstance(r, BaseException)]
        if ok:
            for m, r in zip(self.members, results, strict=True):
                if isinstance(r, BaseException) and _unreachable(r):
                    m.mark_down()
            return ok
        for r in results:
            if isinstance(r, BaseException) and not _unreachable(r):
                raise r
        raise results[0]  # type: ignore[misc]


class GroupCommitLog:
    """CommitLogPort over a BrokerGroup (writes to the master, reads with fallback)."""

    def __init__(self, group: BrokerGroup) -> None:
        self.group = group

    async def append(
        self, messages: Sequence[MessageFields], *, expected_epoch: int = 0
    ) -> PutMessageResults:
        return await self.group.on_master(
            lambda m: m.commitlog.append(messages, expected_epoch=expected_epoch)
        )

    async def append_records(self, raw: bytes, born_host: str = "") -> PutMessageResults:
        return await self.group.on_master(lambda m: m.commitlog.append_records(raw, born_host))

    async def _readers(self, ranges: Sequence[tuple[int, int]]) -> list[Member]:
        """The members to read ``ranges`` from, in the order to try them: a slave first when
        slave reads are on and the master is past ``slave_read_lag_bytes`` ahead of them."""
        members = await self.group.readers()
        if self.group.slave_read_enable and len(members) > 1 and members[0].is_master:
            lowest = min(o for o, _ in ranges)
            if members[0].max_offset - lowest > self.group.slave_read_lag_bytes:
                members = [*members[1:], members[0]]
        return members

    async def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        if not ranges:
            return []
        members = await self._readers(ranges)
        out: list[bytes | None] | None = None  # the first answer; later members fill its gaps
        missing: list[int] = []
        last: BaseException | None = None
        for member in members:
            try:
                got = await member.commitlog.read(ranges if out is None else [ranges[i] for i in missing])
            except (StoreError, grpc.RpcError) as exc:
                if not _unreachable(exc):
                    raise
                member.mark_down()
                last = exc
                continue
            if out is None:
                out = got
                # Nearly always complete: told by a C scan, no per-record loop.
                missing = [i for i, raw in enumerate(got) if raw is None] if None in got else []
            else:
                for i, raw in zip(missing, got, strict=True):
                    out[i] = raw
                missing = [i for i in missing if out[i] is None]
            if not missing:
                break
        if out is None:
            if last is not None:
                raise last
            return [None] * len(ranges)
        return out

    async def read_framed(self, ranges: Sequence[tuple[int, int]], tag: int) -> bytes | bytearray:
        """The first member that answers, as it answers: records it lacks are framed empty (a
        caller that finds some missing reads them through :meth:`read`, which asks the others)."""
        last: BaseException | None = None
        for member in await self._readers(ranges) if ranges else []:
            try:
                return await member.commitlog.read_framed(ranges, tag)
            except (StoreError, grpc.RpcError) as exc:
                if not _unreachable(exc):
                    raise
                member.mark_down()
                last = exc
        if last is not None:
            raise last
        return frame_records([None] * len(ranges), tag)

    def tail(
        self,
        from_offset: int,
        *,
        max_chunk_bytes: int = 0,
        heartbeat_ms: int = 0,
        decoded: bool = False,
        log_id: str = "",
        generation: int = 0,
        linger_ms: int = 0,
    ) -> AsyncIterator[TailChunk]:
        raise ServiceNotAvailableError("a gateway does not tail a broker group: tail one member's commitlog")

    async def offsets(self) -> LogOffsets:
        try:
            return await self.group.on_master(lambda m: m.commitlog.offsets())
        except (StoreError, grpc.RpcError) as exc:
            if not _unreachable(exc):
                raise
            return await self.group.on_reader(lambda m: m.commitlog.offsets())

    async def upsert_topic(self, config: TopicConfig) -> TopicConfig:
        return await self.group.on_master(lambda m: m.commitlog.upsert_topic(config))

    async def get_topic(self, topic: str, *, create: bool = False) -> TopicConfig | None:
        if create:
            try:
                return await self.group.on_master(lambda m: m.commitlog.get_topic(topic, create=True))
            except (StoreError, grpc.RpcError) as exc:
                if not _unreachable(exc):
                    raise
        return await self.group.on_reader(lambda m: m.commitlog.get_topic(topic))

    async def list_topics(self) -> list[TopicConfig]:
        return await self.group.on_reader(lambda m: m.commitlog.list_topics())

    async def delete_topic(self, topic: str) -> bool:
        return await self.group.on_master(lambda m: m.commitlog.delete_topic(topic))

    async def topic_tombstones(self) -> dict[str, int]:
        return await self.group.on_reader(lambda m: m.commitlog.topic_tombstones())

    async def release_transient(
        self, below: int, log_id: str = "", generation: int = 0, keep: Sequence[int] = ()
    ) -> int:
        # Only the master holds transient messages (never replicated).
        return await self.group.on_master(
            lambda m: m.commitlog.release_transient(below, log_id, generation, keep)
        )


class GroupDispatch:
    """DispatchPort over a BrokerGroup (reads with fallback, offsets kept on every member)."""

    def __init__(self, group: BrokerGroup) -> None:
        self.group = group

    async def get_entries(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        max_bytes: int = 0,
        tag_codes: Sequence[int] = (),
        wait_ms: int = 0,
    ) -> Entries:
        return await self.group.on_reader(
            lambda m: m.dispatch.get_entries(
                topic, queue_id, offset, max_count, max_bytes=max_bytes, tag_codes=tag_codes, wait_ms=wait_ms
            )
        )

    async def get_entries_many(
        self,
        topic: str,
        queries: Sequence[tuple[int, int, int]],
        *,
        max_bytes: int = 0,
        total_bytes: int = 0,
        tag_codes: Sequence[int] = (),
        wait_ms: int = 0,
    ) -> list[Entries]:
        return await self.group.on_reader(
            lambda m: m.dispatch.get_entries_many(
                topic,
                queries,
                max_bytes=max_bytes,
                total_bytes=total_bytes,
                tag_codes=tag_codes,
                wait_ms=wait_ms,
            )
        )

    async def queue_info(self, topic: str, queue_id: int = -1) -> list[QueueInfo]:
        return await self.group.on_reader(lambda m: m.dispatch.queue_info(topic, queue_id))

    async def offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, boundary: BoundaryType = BoundaryType.LOWER
    ) -> int:
        return await self.group.on_reader(
            lambda m: m.dispatch.offset_by_time(topic, queue_id, timestamp_ms, boundary)
        )

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        await self.group.on_all(lambda m: m.dispatch.commit_offset(group, topic, queue_id, offset))

    async def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        return max(await self.group.on_all(lambda m: m.dispatch.query_offset(group, topic, queue_id)))

    async def consumer_progress(self, group: str, topic: str, queue_nums: int) -> list[QueueProgress]:
        views = await self.group.on_all(lambda m: m.dispatch.consumer_progress(group, topic, queue_nums))
        merged = []
        for per_queue in zip(*views, strict=True):
            best = max(per_queue, key=lambda q: (q.max_offset, q.committed_offset))
            committed = max(q.committed_offset for q in per_queue)
            merged.append(QueueProgress(best.queue_id, committed, best.min_offset, best.max_offset))
        return merged

    async def status(self) -> DerivedStatus:
        return await self.group.on_reader(lambda m: m.dispatch.status())

    # The pop model's state lives with the master's dispatch service: a slave's dispatch keeps
    # its own (unused) pop state, so receives, acks and invisible-time changes go to the master.
    async def pop(self, group: str, topic: str, queue_id: int, **kw: Any) -> PopResult:
        return await self.group.on_master(lambda m: m.dispatch.pop(group, topic, queue_id, **kw))

    async def ack(self, group: str, topic: str, receipt_handles: Sequence[str]) -> list[StoreError | None]:
        return await self.group.on_master(lambda m: m.dispatch.ack(group, topic, receipt_handles))

    async def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        return await self.group.on_master(
            lambda m: m.dispatch.change_invisible(group, topic, receipt_handle, invisible_ms)
        )

    async def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> None:
        await self.group.on_master(lambda m: m.dispatch.forward_to_dead_letter(group, topic, receipt_handle))

    async def upsert_group(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        results = await self.group.on_all(lambda m: m.dispatch.upsert_group(config))
        return results[0]

    async def get_group(self, group: str) -> SubscriptionGroupConfig:
        return await self.group.on_reader(lambda m: m.dispatch.get_group(group))

    # Half messages are ended and checked on the master (the slaves' copies are never served).
    async def end_transaction(self, transaction_id: str, message_id: str, commit: bool, topic: str) -> None:
        await self.group.on_master(
            lambda m: m.dispatch.end_transaction(transaction_id, message_id, commit, topic)
        )

    async def claim_transaction_checks(
        self, topics: Sequence[str], max_count: int = 64
    ) -> list[TransactionCheck]:
        return await self.group.on_master(lambda m: m.dispatch.claim_transaction_checks(topics, max_count))


class GroupIndex:
    """IndexPort over a BrokerGroup (reads with fallback)."""

    def __init__(self, group: BrokerGroup) -> None:
        self.group = group

    async def query_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int
    ) -> list[int]:
        return await self.group.on_reader(
            lambda m: m.index.query_by_key(topic, key, begin_ms, end_ms, max_count)
        )

    async def status(self) -> DerivedStatus:
        return await self.group.on_reader(lambda m: m.index.status())
