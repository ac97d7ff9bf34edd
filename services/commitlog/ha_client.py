"""ReplicationClient: a slave's end of mqstore.v1.HAService.Replicate (protos/mqstore/v1/ha.proto).

One stream to the master's HA endpoint at a time: send a hello (broker group, log end, epochs),
apply the welcome (cut the divergent tail, or start the log over, then take the master's epochs
and topic table), then append every data frame at its offset
(:meth:`libstore.CommitLog.append_replica`) and acknowledge the new log end after each frame
and at least every ``haSendHeartbeatInterval`` ms. A master silent for
``haHousekeepingInterval`` ms, a broken stream, or a frame that does not fit the log ends the
session; the next one starts after a tenacity backoff (0.2 s doubling to 5 s, with jitter),
forever, until :meth:`stop`. A master that answers NOT_MASTER or cannot be reached is looked up
again among the peers first (a slave follows whichever member was promoted in its place).

The ack is the slave's written log end, as in RocketMQ: a SYNC_MASTER put is acknowledged when
the slave holds it in its page cache; the slave's own flush policy makes it durable. Each frame
also carries the master's confirm offset, which bounds what the slave's consumers see
(CommitLog.set_master_confirm, RocketMQ 5's confirmOffset).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import grpc
from tenacity import AsyncRetrying, retry_if_exception, retry_if_exception_type, wait_random_exponential

from libstore import CommitLog, NotMasterError, RoleSwitchError, StoreError
from libstore.aio_deadline import wait_within
from libstore.ha_state import EpochEntry
from services._common import convert
from services._common.remote import open_channel, reraise_mapped
from services._common.telemetry import tracer
from services._common.tls import TlsConfig
from services.proto import commitlog_pb, ha_grpc, ha_pb

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 5.0  # how long stop() waits for a cancelled session to wind down


class _SessionEnded(Exception):
    """The stream ended; reconnect."""


class ReplicationClient:
    """Replicates ``commit_log`` (a SLAVE) from ``master_address`` until stopped.

    ``on_cut`` is called after the log was cut or reset (the caller drops caches that point into
    it). ``min_epoch``: refuse a master whose epoch is older (a demoted store must not follow a
    stale master). ``commitlog_address`` is this store's CommitLogService endpoint, told to
    the master for its status page. ``discover`` (optional) finds the group's current master's
    HA endpoint when the one followed answers NOT_MASTER (it was demoted). ``tls``: the
    stream is TLS with this process's client certificate (a master with a CA refuses slaves
    without one signed by it).
    """

    def __init__(
        self,
        commit_log: CommitLog,
        master_address: str,
        *,
        commitlog_address: str = "",
        on_cut: Callable[[], None] | None = None,
        min_epoch: int = 0,
        discover: Callable[[], Awaitable[str]] | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.log = commit_log
        self.config = commit_log.config
        self.master_address = master_address
        self.commitlog_address = commitlog_address
        self.on_cut = on_cut
        self.min_epoch = min_epoch
        self.discover = discover
        self.tls = tls
        self._pending: list[EpochEntry] = []
        self._welcomed = False
        self.connected = False
        self.master_epoch = 0
        self.master_role = ""
        self.master_max_offset = 0
        # The master's epoch when this slave last held everything the master had written (its
        # log end at or past the master's, as a frame reported it); 0 until then. A store
        # that restarted starts at 0 again: whatever it held before may be lost.
        self.caught_up_epoch = 0
        self.last_frame = 0.0
        self.sessions = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._write_lock = asyncio.Lock()
        self._tracer = tracer("mqstore.ha")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ha-client")

    async def stop(self) -> None:
        """Cancel the replication task and wait for it, at most STOP_TIMEOUT_S: a session whose
        cancellation hangs in gRPC (a TLS channel that does not close) must not hold up a role
        switch; it is left cancelled, and nothing it does afterwards is applied (the log's role
        no longer takes replica bytes)."""
        task, self._task = self._task, None
        self._stopping = True  # a cancellation that gRPC turns into an error ends the retries too
        if task is not None:
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
            if not done:
                log.warning(
                    "replication from %s did not stop within %.0f s; left behind",
                    self.master_address,
                    STOP_TIMEOUT_S,
                )
            else:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    task.result()
        self.connected = False

    @property
    def lag_bytes(self) -> int:
        return max(self.master_max_offset - self.log.max_offset, 0)

    async def _run(self) -> None:
        while not self._stopping:  # one backoff schedule per outage: a session that was up starts it afresh
            retrying = AsyncRetrying(
                wait=wait_random_exponential(multiplier=0.2, max=5.0),
                # The slave never stops trying until stop(): its cancellation may reach the
                # session as a gRPC error ("Cancelling all calls"), not as CancelledError.
                retry=retry_if_exception_type(Exception)
                & retry_if_exception(lambda _exc: not self._stopping),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    await self._attempt()

    async def _attempt(self) -> None:
        """One session; returns (so the backoff restarts) only when it got as far as the welcome."""
        try:
            await self._session()
        except (StoreError, grpc.RpcError, _SessionEnded):
            if self._welcomed:
                return
            raise
        except Exception:
            log.exception("replication from %s failed; reconnecting", self.master_address)
            if self._welcomed:
                return
            raise

    async def _session(self) -> None:
        channel = open_channel(self.master_address, self.tls)
        call = ha_grpc.HAServiceStub(channel).Replicate()
        heartbeat: asyncio.Task[None] | None = None
        self.sessions += 1
        self._welcomed = False
        try:
            try:
                await self._handshake(call)
                heartbeat = asyncio.create_task(self._heartbeat(call))
                await self._follow(call)
            except grpc.RpcError as err:
                reraise_mapped(err)
        except NotMasterError:
            await self._rediscover("is no longer the master")
            raise
        except StoreError as exc:
            log.warning("replication from %s failed: %s; reconnecting", self.master_address, exc)
            if not self._welcomed:  # unreachable: it may be gone for good, another one promoted
                await self._rediscover("cannot be reached")
            raise
        except asyncio.InvalidStateError:  # a write to a call that already ended (connection refused)
            raise _SessionEnded(f"cannot reach the master at {self.master_address}") from None
        except grpc.RpcError as err:
            log.info(
                "replication from %s interrupted (%s); reconnecting", self.master_address, err.code().name
            )
            raise
        finally:
            self.connected = False
            if heartbeat is not None:
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await heartbeat
            call.cancel()
            await channel.close()

    async def _rediscover(self, why: str) -> None:
        """Follow the group's current master (``discover``) when it is not the one followed."""
        try:
            found = await self.discover() if self.discover is not None else ""
        except (StoreError, grpc.RpcError):
            return
        if found and found != self.master_address:
            log.warning("%s %s; following %s, the master peers report", self.master_address, why, found)
            self.master_address = found

    async def _read(self, call: grpc.aio.StreamStreamCall) -> ha_pb.MasterFrame:
        frame = await wait_within(call.read(), self.config.ha_housekeeping_interval / 1000.0)
        if frame is grpc.aio.EOF:
            await call  # raises the status the master ended with
            raise _SessionEnded("the master closed the replication stream")
        self.last_frame = time.monotonic()
        return frame

    async def _ack(self, call: grpc.aio.StreamStreamCall) -> None:
        async with self._write_lock:
            await call.write(ha_pb.SlaveReport(ack=ha_pb.SlaveAck(max_offset=self.log.max_offset)))

    async def _handshake(self, call: grpc.aio.StreamStreamCall) -> None:
        log_ = self.log
        cfg = self.config
        hello = ha_pb.SlaveHello(
            broker_name=cfg.broker_name,
            broker_id=cfg.broker_id,
            max_offset=log_.max_offset,
            epochs=[
                commitlog_pb.EpochEntry(epoch=e.epoch, start_offset=e.start_offset)
                for e in log_.ha_state.epochs
            ],
            mapped_file_size=cfg.mapped_file_size_commit_log,
            commitlog_address=self.commitlog_address,
        )
        async with self._write_lock:
            await call.write(ha_pb.SlaveReport(hello=hello))
        frame = await self._read(call)
        if frame.WhichOneof("kind") != "welcome":
            raise _SessionEnded("the master did not answer the hello with a welcome")
        welcome = frame.welcome
        if welcome.epoch < self.min_epoch:
            raise RoleSwitchError(
                f"{self.master_address} is at epoch {welcome.epoch}, older than {self.min_epoch}: "
                "not following it"
            )
        with self._tracer.start_as_current_span("ha.handshake") as span:
            span.set_attribute("mqstore.master", self.master_address)
            span.set_attribute("mqstore.start_offset", welcome.start_offset)
            span.set_attribute("mqstore.truncate_to", welcome.truncate_to)
            if welcome.reset:
                await asyncio.to_thread(log_.reset_to, welcome.start_offset)
                self._cut()
            elif 0 <= welcome.truncate_to < log_.max_offset:
                await asyncio.to_thread(log_.truncate_to, welcome.truncate_to)
                self._cut()
        if log_.max_offset != welcome.start_offset:
            raise _SessionEnded(
                f"the master starts at {welcome.start_offset}, this log ends at {log_.max_offset}"
            )
        entries = [EpochEntry(e.epoch, e.start_offset) for e in welcome.epochs]
        log_.ha_state.adopt(entries, log_.max_offset)
        self._pending = [e for e in entries if e.start_offset > log_.max_offset]
        log_.topic_config.replace_all(
            [convert.topic_from_pb(t) for t in welcome.topics], dict(welcome.tombstones)
        )
        self.master_epoch = welcome.epoch
        self.master_role = welcome.broker_role
        self.master_max_offset = welcome.master_max_offset
        self.connected = self._welcomed = True
        if log_.max_offset >= welcome.master_max_offset:
            self.caught_up_epoch = welcome.epoch
        log.info(
            "replicating from %s (epoch %d, %s) at offset %d; the master is at %d",
            self.master_address,
            welcome.epoch,
            welcome.broker_role,
            log_.max_offset,
            welcome.master_max_offset,
        )
        await self._ack(call)

    def _cut(self) -> None:
        if self.on_cut is not None:
            self.on_cut()

    async def _follow(self, call: grpc.aio.StreamStreamCall) -> None:
        log_ = self.log
        while True:
            frame = await self._read(call)
            kind = frame.WhichOneof("kind")
            if kind == "data":
                data = frame.data
                self.master_max_offset = data.master_max_offset
                if data.data:
                    end = log_.append_replica(data.offset, data.data)
                    if self._pending:
                        self._pending = log_.ha_state.extend_to(self._pending, end)
                    await self._ack(call)
                if log_.max_offset >= data.master_max_offset:
                    self.caught_up_epoch = self.master_epoch
                log_.set_master_confirm(data.master_confirm_offset)
            elif kind == "topics":
                log_.topic_config.replace_all(
                    [convert.topic_from_pb(t) for t in frame.topics.topics], dict(frame.topics.tombstones)
                )

    async def _heartbeat(self, call: grpc.aio.StreamStreamCall) -> None:
        interval = self.config.ha_send_heartbeat_interval / 1000.0
        while True:
            await asyncio.sleep(interval)
            await self._ack(call)
