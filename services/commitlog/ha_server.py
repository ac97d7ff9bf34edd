"""ReplicationServicer: the master's end of mqstore.v1.HAService.Replicate (see protos/mqstore/v1/
ha.proto and spec sheet §7).

Per slave stream: read its hello, check it belongs to this broker group, find where its log and
ours agree (:func:`libstore.ha_state.find_consistent_point`) and answer with a welcome (cut
there, or start over when it shares no epoch with us or we no longer hold what follows its
end); then send raw log bytes from there as the log grows (whole records, at most
``haTransferBatchSize`` bytes a frame, never past a segment's end), the topic table when it
changes, and a heartbeat frame after ``haSendHeartbeatInterval`` ms of silence. The slave's
acks go to :class:`libstore.ha_service.HAService`. A slave silent for ``haHousekeepingInterval``
ms is dropped and its stream cancelled (the controller's housekeeping); when this store stops
being the master every stream ends with NOT_MASTER (or is cancelled while blocked on a slave
that takes no bytes).

Unlike RocketMQ (which starts a new slave at the beginning of the master's last segment), a slave
with an empty log receives everything the master still holds, so its files are the master's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc

from libstore import BrokerRole, CommitLog, InvalidArgumentError, NotMasterError
from libstore.aio_deadline import wait_within
from libstore.ha_service import HAConnection
from libstore.ha_state import EpochEntry, find_consistent_point
from services._common import convert
from services._common.telemetry import tracer
from services.proto import commitlog_pb, ha_grpc, ha_pb

log = logging.getLogger(__name__)

SERVICE_NAME = ha_pb.DESCRIPTOR.services_by_name["HAService"].full_name


class ReplicationServicer(ha_grpc.HAServiceServicer):
    """Serves slaves of ``commit_log`` while it is a master."""

    def __init__(self, commit_log: CommitLog) -> None:
        self.log = commit_log
        self.config = commit_log.config
        self._streams: dict[HAConnection, tuple[asyncio.Event, asyncio.Task[object] | None]] = {}
        self._tracer = tracer("mqstore.ha")

    def wake_all(self) -> None:
        """Wake every stream's sender: it ends the stream when this store is no longer the
        master (NOT_MASTER)."""
        for wake, _ in list(self._streams.values()):
            wake.set()

    def end_streams(self, conns: list[HAConnection] | None = None) -> None:
        """End the streams of ``conns`` (default: all) now, even one blocked on a slave that
        takes no bytes (a dropped or stopped slave, or this store stopped being the master)."""
        for conn, (wake, task) in list(self._streams.items()):
            if conns is None or conn in conns:
                wake.set()
                if task is not None:
                    task.cancel()

    async def Replicate(
        self, request_iterator: AsyncIterator[ha_pb.SlaveReport], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ha_pb.MasterFrame]:
        cfg = self.config
        reports = request_iterator.__aiter__()
        try:
            first = await wait_within(reports.__anext__(), cfg.ha_housekeeping_interval / 1000.0)
        except (StopAsyncIteration, TimeoutError):
            return
        if first.WhichOneof("kind") != "hello":
            raise InvalidArgumentError("a replication stream starts with a hello")
        hello = first.hello
        self._check_master()
        if hello.broker_name != cfg.broker_name:
            raise InvalidArgumentError(
                f"slave of broker group {hello.broker_name!r} reached the master of {cfg.broker_name!r}"
            )
        if hello.mapped_file_size != cfg.mapped_file_size_commit_log:
            raise InvalidArgumentError(
                f"slave CommitLog segments are {hello.mapped_file_size} bytes, the master's "
                f"{cfg.mapped_file_size_commit_log}: they must be equal"
            )
        welcome = self._welcome(hello)
        with self._tracer.start_as_current_span("ha.handshake") as span:
            span.set_attribute("mqstore.slave", context.peer())
            span.set_attribute("mqstore.start_offset", welcome.start_offset)
            span.set_attribute("mqstore.truncate_to", welcome.truncate_to)
        log.info(
            "slave %s (id %d, log end %d): streaming from %d%s",
            context.peer(),
            hello.broker_id,
            hello.max_offset,
            welcome.start_offset,
            f", cut at {welcome.truncate_to}" if welcome.truncate_to >= 0 else "",
        )
        yield ha_pb.MasterFrame(welcome=welcome)
        ha = self.log.ha_service
        conn = ha.register(hello.commitlog_address or context.peer(), hello.broker_id, welcome.start_offset)
        wake = asyncio.Event()
        self._streams[conn] = (wake, asyncio.current_task())
        loop = asyncio.get_running_loop()

        def on_append(_offset: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(wake.set)

        self.log.add_append_listener(on_append)
        self.log.add_confirm_listener(on_append)  # the confirm offset goes to the slaves too
        reader = asyncio.create_task(self._read_acks(reports, conn, wake))
        try:
            async for frame in self._frames(conn, welcome.start_offset, wake, reader):
                yield frame
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self.log.remove_append_listener(on_append)
            self.log.remove_confirm_listener(on_append)
            self._streams.pop(conn, None)
            ha.unregister(conn)

    def _check_master(self) -> None:
        if self.log.broker_role is BrokerRole.SLAVE:
            raise NotMasterError(
                f"this store is a SLAVE of {self.config.broker_name}: replicate from its master"
            )

    def _welcome(self, hello: ha_pb.SlaveHello) -> ha_pb.MasterWelcome:
        log_ = self.log
        ours = log_.ha_state.epochs
        master_max, master_min = log_.max_offset, log_.min_offset
        theirs = [EpochEntry(e.epoch, e.start_offset) for e in hello.epochs]
        slave_max = hello.max_offset
        truncate_to, reset, start = -1, False, slave_max
        if slave_max > 0 or theirs:
            point = find_consistent_point(theirs, slave_max, ours, master_max)
            if point < 0:
                log.warning("slave shares no epoch with this master: it starts over at %d", master_min)
                reset, start = True, master_min
            elif point < slave_max:
                truncate_to, start = point, point
        if not reset and (start < master_min or start > master_max):
            reset, start = True, master_min
        return ha_pb.MasterWelcome(
            epoch=ours[-1].epoch if ours else 0,
            epochs=[commitlog_pb.EpochEntry(epoch=e.epoch, start_offset=e.start_offset) for e in ours],
            truncate_to=truncate_to,
            reset=reset,
            start_offset=start,
            broker_role=log_.broker_role.value,
            master_max_offset=master_max,
            topics=[convert.topic_to_pb(t) for t in log_.topic_config.list()],
            tombstones=log_.topic_config.tombstones(),
        )

    async def _read_acks(
        self, reports: AsyncIterator[ha_pb.SlaveReport], conn: HAConnection, wake: asyncio.Event
    ) -> None:
        ha = self.log.ha_service
        try:
            async for report in reports:
                if report.WhichOneof("kind") == "ack":
                    ha.report(conn, report.ack.max_offset)
        finally:
            wake.set()

    async def _frames(
        self, conn: HAConnection, offset: int, wake: asyncio.Event, reader: asyncio.Task[None]
    ) -> AsyncIterator[ha_pb.MasterFrame]:
        """Frames for one slave from ``offset`` until it leaves or this store is demoted."""
        cfg = self.config
        log_ = self.log
        topics = log_.topic_config
        topics_sent = topics.version
        heartbeat_s = cfg.ha_send_heartbeat_interval / 1000.0
        batch = cfg.ha_transfer_batch_size
        confirm_sent = -1
        while True:
            wake.clear()
            if reader.done() or conn.closed:
                return
            self._check_master()
            if topics.version != topics_sent:
                topics_sent = topics.version
                yield ha_pb.MasterFrame(
                    topics=ha_pb.TopicTable(
                        topics=[convert.topic_to_pb(t) for t in topics.list()], tombstones=topics.tombstones()
                    )
                )
            top = log_.max_offset
            if offset < top:
                data, next_offset = log_.read_chunk(offset, top, batch)
                conn.sent_offset = next_offset  # before the slave can ack it
                yield ha_pb.MasterFrame(
                    data=ha_pb.ReplicaData(
                        offset=offset,
                        data=data,
                        master_max_offset=top,
                        master_confirm_offset=log_.confirm_offset,
                    )
                )
                offset = next_offset
                continue
            confirm = log_.confirm_offset
            if confirm != confirm_sent:  # the slaves' acks moved it: tell them
                confirm_sent = confirm
                yield ha_pb.MasterFrame(
                    data=ha_pb.ReplicaData(
                        offset=offset, master_max_offset=top, master_confirm_offset=confirm
                    )
                )
                continue
            try:
                await wait_within(wake.wait(), heartbeat_s)
            except TimeoutError:
                yield ha_pb.MasterFrame(
                    data=ha_pb.ReplicaData(
                        offset=offset, master_max_offset=top, master_confirm_offset=confirm
                    )
                )


def add_to_server(servicer: ReplicationServicer, server: grpc.aio.Server) -> list[str]:
    ha_grpc.add_HAServiceServicer_to_server(servicer, server)
    return [SERVICE_NAME]
