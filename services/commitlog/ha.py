"""HAController: the role of one commitlog service in its broker group, and role switches.

A broker group is one master (ASYNC_MASTER or SYNC_MASTER, broker id 0 at first) and its slaves.
Each store keeps its epochs and current role in ``config/haState.json`` (libstore.ha_state).

Start: the role is the one saved by the last switch, else the configured one.
* A SLAVE follows ``haMasterAddress`` (or the saved master, or the peer that says it is the
  master) with a :class:`ReplicationClient`.
* A master first asks its peers (``--ha-peers``: the other members' CommitLogService endpoints)
  whether one of them is a master of a newer epoch; if so it was replaced while it was away, and
  it rejoins as that master's SLAVE (the handshake cuts the tail its successor never had). Else
  it begins a new epoch (the next term past the newest it or a reachable peer knows, numbered
  with its broker id: libstore.ha_state.next_epoch) at its recovered end and serves slaves on
  its HA endpoint. The new epoch is what keeps a crash honest: a slave may
  hold bytes this store wrote but never fsynced and lost; had the store kept its epoch, the
  handshake would take those bytes for the ones it writes next at the same offsets.

While running, a master with peers keeps asking them (every ``haSendHeartbeatInterval`` ms): a
newer master among them demotes it at once (fencing), so two masters never take writes for the
same epoch and an old one stops as soon as it can see the new one. Unreachable peers cannot be
asked; a master cut off from its successor keeps its own (older) epoch until it can, and under
SYNC_MASTER it cannot acknowledge anything meanwhile because its slave is gone.

Switches (CommitLogService Promote/Demote, ``mqstore ha promote|demote``):
* promote (a SLAVE): stop replicating, refill the de-duplication window from the log, start
  the next epoch past every known one at the log's end (persisted before any write), take the role
  (by default the old master's: SYNC_MASTER or ASYNC_MASTER). Refused while the old master is
  still connected or answers as master, or while another slave holds more of the log (newer
  epoch, then more bytes: it may hold acknowledged messages this one lacks), unless forced.
  Forced, a master that still answers is demoted *before* this store takes the role, and the
  switch is refused if it does not step down (two masters taking writes is a split brain); a
  master that does not answer cannot be asked, and learns of the newer epoch when it can.
* demote (a master): refuse puts from now on, fail pending SYNC_MASTER waits
  (SLAVE_NOT_AVAILABLE), end the slaves' streams (NOT_MASTER), save the role, follow the new
  master.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from opentelemetry.metrics import CallbackOptions, Observation

from libstore import BrokerRole, ConfigError, InvalidArgumentError, RoleSwitchError, StoreError
from libstore.ha_state import EpochEntry, next_epoch
from services._common.remote import open_channel
from services._common.telemetry import meter
from services._common.tls import TlsConfig
from services.commitlog.client import RemoteCommitLog
from services.commitlog.election import DEFAULT_PREFIX, ElectionAgent
from services.commitlog.etcd import EtcdCluster
from services.commitlog.ha_client import ReplicationClient
from services.commitlog.ha_server import ReplicationServicer
from services.commitlog.local import LocalCommitLog
from services.proto import commitlog_pb

log = logging.getLogger(__name__)

# Controllers of this process, read by the metric callbacks (registered once per process).
_LIVE: weakref.WeakSet[HAController] = weakref.WeakSet()
_metrics_registered = False


def _register_metrics() -> None:
    """Observable gauges over every live controller: per slave (master side) lag in bytes and
    ms and the acknowledged offset; per slave store, bytes behind its master."""
    global _metrics_registered
    if _metrics_registered:
        return
    _metrics_registered = True
    m = meter("mqstore.ha")

    def per_slave(field: str) -> Callable[[CallbackOptions], list[Observation]]:
        def observe(_options: CallbackOptions) -> list[Observation]:
            return [
                Observation(
                    getattr(s, field),
                    {"broker_name": c.config.broker_name, "slave": s.address, "slave_broker_id": s.broker_id},
                )
                for c in list(_LIVE)
                for s in c.log.ha_service.lag()
            ]

        return observe

    def behind_master(_options: CallbackOptions) -> list[Observation]:
        return [
            Observation(
                c.client.lag_bytes, {"broker_name": c.config.broker_name, "master": c.client.master_address}
            )
            for c in list(_LIVE)
            if c.client is not None
        ]

    m.create_observable_gauge(
        "mqstore.ha.replication_lag_bytes",
        [per_slave("lag_bytes")],
        unit="By",
        description="bytes a slave lacks",
    )
    m.create_observable_gauge(
        "mqstore.ha.replication_lag_ms",
        [per_slave("lag_ms")],
        unit="ms",
        description="time since the master wrote the first byte a slave lacks",
    )
    m.create_observable_gauge(
        "mqstore.ha.slave_ack_offset",
        [per_slave("ack_offset")],
        unit="By",
        description="CommitLog offset a slave acknowledged",
    )
    m.create_observable_gauge(
        "mqstore.ha.master_lag_bytes",
        [behind_master],
        unit="By",
        description="slave: bytes behind its master's log end, as last heard",
    )


PEER_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ElectionSettings:
    """``--election etcd``: the etcd ``endpoints`` (host, port), the role an elected member
    takes, the key prefix, whether an unclean election is allowed, and a callback told
    whether the group has a master (the service's health)."""

    endpoints: tuple[tuple[str, int], ...]
    master_role: BrokerRole = BrokerRole.ASYNC_MASTER
    prefix: str = DEFAULT_PREFIX
    unclean: bool = False
    on_serving: Callable[[bool], None] | None = None


class HAController:
    """Role management for the commitlog service over ``port`` (see module docstring).

    ``ha_address`` is this store's replication endpoint as peers reach it; ``commitlog_address``
    its CommitLogService endpoint; ``peers`` the other members' CommitLogService endpoints.
    ``tls``: channels to peers and to the master (replication) use TLS with this process's
    client certificate.
    """

    def __init__(
        self,
        port: LocalCommitLog,
        *,
        ha_address: str,
        commitlog_address: str,
        peers: Sequence[str] = (),
        tls: TlsConfig | None = None,
        election: ElectionSettings | None = None,
    ) -> None:
        self.port = port
        self.log = port.log
        self.config = port.log.config
        self.ha_address = ha_address
        self.commitlog_address = commitlog_address
        self.peers = [p for p in peers if p and p != commitlog_address]
        self.tls = tls
        self.replication = ReplicationServicer(self.log)
        self.client: ReplicationClient | None = None
        self._switch = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.election: ElectionAgent | None = None
        if election is not None:
            self.election = ElectionAgent(
                self,
                EtcdCluster(election.endpoints),
                master_role=election.master_role,
                prefix=election.prefix,
                unclean=election.unclean or self.config.enable_elect_unclean_master,
                on_serving=election.on_serving,
            )
            # Puts are taken and acknowledged only while this store holds the leadership lease.
            port.fence = self.election.may_acknowledge
        _register_metrics()
        _LIVE.add(self)

    # -- life -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Settle the role (see module docstring) and start replication or serving slaves.
        Raises ConfigError when a SLAVE has no master to follow."""
        if self.election is not None:
            # The election decides: until etcd names a master, this store takes no puts.
            if self.log.broker_role is not BrokerRole.SLAVE:
                await asyncio.to_thread(self.log.set_broker_role, BrokerRole.SLAVE)
                self.log.ha_state.save_role(BrokerRole.SLAVE)
            await self.election.start()
        elif self.log.broker_role is BrokerRole.SLAVE:
            master = (
                self.log.ha_state.master_address
                or self.config.ha_master_address
                or await self._discover_master()
            )
            if not master:
                raise ConfigError(
                    "a SLAVE needs its master's HA endpoint: set haMasterAddress (--ha-master) or --ha-peers"
                )
            self._start_client(master, min_epoch=0)
        else:
            peers = await self._peer_states()
            newer = self._newer_master(peers)
            if newer is not None:
                log.warning(
                    "%s is the master of epoch %d (ours: %d): rejoining as its SLAVE",
                    newer.commitlog_address,
                    newer.epoch,
                    self.log.ha_state.last_epoch,
                )
                await self._become_slave(newer.ha_address, newer.epoch)
            else:
                # A new term at the recovered end: bytes a slave received before a crash that
                # this store then lost are never mistaken for what it writes from now on.
                known = max([self.log.ha_state.last_epoch, *(st.epoch for st in peers)])
                epoch = next_epoch(known, self.config.broker_id)
                await asyncio.to_thread(self.log.start_master_term, self.log.broker_role, epoch)
        self._task = asyncio.get_running_loop().create_task(self._housekeeping(), name="ha-housekeeping")

    async def stop(self) -> None:
        _LIVE.discard(self)
        if self.election is not None:
            await self.election.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._stop_client()
        self.replication.end_streams()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def _housekeeping(self) -> None:
        """Every second: drop silent slaves; every haSendHeartbeatInterval: the fencing check."""
        interval = self.config.ha_send_heartbeat_interval / 1000.0
        loop = asyncio.get_running_loop()
        next_fence = loop.time() + interval
        while True:
            await asyncio.sleep(min(interval, 1.0))
            dead = self.log.ha_service.expire()
            if dead:
                self.replication.end_streams(dead)
            if self.log.broker_role is BrokerRole.SLAVE or not self.peers or loop.time() < next_fence:
                continue
            next_fence = loop.time() + interval
            try:
                newer = self._newer_master(await self._peer_states())
                if newer is not None:
                    log.warning(
                        "fencing: %s is the master of epoch %d, newer than ours (%d); demoting this store",
                        newer.commitlog_address,
                        newer.epoch,
                        self.log.ha_state.last_epoch,
                    )
                    await self.demote(newer.ha_address, newer.epoch)
            except StoreError as exc:
                log.warning("fencing check failed: %s", exc)

    # -- peers ------------------------------------------------------------------------------------
    async def _peer_states(self) -> list[commitlog_pb.HAState]:
        async def one(address: str) -> commitlog_pb.HAState | None:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = open_channel(address, self.tls)
            try:
                return await RemoteCommitLog(channel, timeout_s=PEER_TIMEOUT_S).ha_state()
            except (StoreError, grpc.RpcError):
                return None

        states = await asyncio.gather(*(one(p) for p in self.peers))
        return [s for s in states if s is not None]

    def _newer_master(self, peers: list[commitlog_pb.HAState]) -> commitlog_pb.HAState | None:
        """Among ``peers``, a master of a newer epoch than ours (equal epochs, possible only for epochs
        begun before they carried the broker id: the lower broker id wins)."""
        ours = self.log.ha_state.last_epoch
        best = None
        for st in peers:
            if st.broker_role == BrokerRole.SLAVE.value or st.broker_name != self.config.broker_name:
                continue
            newer = st.epoch > ours or (st.epoch == ours and st.broker_id < self.config.broker_id)
            if newer and (best is None or st.epoch > best.epoch):
                best = st
        return best

    async def _discover_master(self) -> str:
        """The HA endpoint of the peer that is the master of the newest epoch (with an
        election: the one etcd names), or ""."""
        if self.election is not None:
            return self.election.leader_ha_address()
        masters = [
            st
            for st in await self._peer_states()
            if st.broker_role != BrokerRole.SLAVE.value and st.broker_name == self.config.broker_name
        ]
        return max(masters, key=lambda st: st.epoch).ha_address if masters else ""

    # -- replication client ---------------------------------------------------------------------
    def _start_client(self, master_address: str, *, min_epoch: int) -> None:
        self.client = ReplicationClient(
            self.log,
            master_address,
            commitlog_address=self.commitlog_address,
            on_cut=self.port.forget_recent,
            min_epoch=min_epoch,
            discover=self._discover_master if self.peers or self.election is not None else None,
            tls=self.tls,
        )
        self.client.start()

    async def _stop_client(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.stop()

    async def _become_slave(self, master_address: str, min_epoch: int) -> None:
        await asyncio.to_thread(self.log.set_broker_role, BrokerRole.SLAVE)
        self.replication.end_streams()
        self.log.ha_state.save_role(BrokerRole.SLAVE, master_address)
        self.port.forget_recent()
        self._start_client(master_address, min_epoch=min_epoch)

    # -- switches ---------------------------------------------------------------------------------
    async def promote(self, role: BrokerRole | None = None, *, force: bool = False) -> commitlog_pb.HAState:
        """Make this store the master (see module docstring); returns the new state.

        Raises RoleSwitchError when the old master still answers (without ``force``),
        InvalidArgumentError for a non-master ``role``."""
        if role is BrokerRole.SLAVE:
            raise InvalidArgumentError("promote to ASYNC_MASTER or SYNC_MASTER, not SLAVE")
        ha_state = self.log.ha_state
        assert ha_state is not None
        if self.election is not None:
            return await self._promote_elected(force)
        async with self._switch:
            if self.log.broker_role is not BrokerRole.SLAVE:
                if role is not None and role is not self.log.broker_role:
                    ha_state.save_role(role)
                    await asyncio.to_thread(self.log.set_broker_role, role)
                return self.state()
            client = self.client
            peers = await self._peer_states()
            live_masters = [st for st in peers if st.broker_role != BrokerRole.SLAVE.value]
            if not force:
                if client is not None and client.connected:
                    raise RoleSwitchError(
                        f"still replicating from the master at {client.master_address}; stop it first, "
                        "or force the switch"
                    )
                if live_masters:
                    raise RoleSwitchError(
                        f"{live_masters[0].commitlog_address} still answers as the master "
                        f"(epoch {live_masters[0].epoch}); stop it first, or force the switch"
                    )
                # The new master must hold everything acknowledged: under SYNC_MASTER with
                # several slaves, only the furthest one is sure to.
                ours = (ha_state.last_epoch, self.log.max_offset)
                ahead = [
                    st
                    for st in peers
                    if st.broker_role == BrokerRole.SLAVE.value
                    and st.broker_name == self.config.broker_name
                    and (st.epoch, st.max_offset) > ours
                ]
                if ahead:
                    best = max(ahead, key=lambda st: (st.epoch, st.max_offset))
                    raise RoleSwitchError(
                        f"{best.commitlog_address} holds more of the log (epoch {best.epoch}, "
                        f"{best.max_offset} bytes; this store: epoch {ours[0]}, {ours[1]} bytes): "
                        "promote it instead, or force the switch"
                    )
            if role is None:
                old = client.master_role if client is not None else ""
                role = BrokerRole(old) if old in ("ASYNC_MASTER", "SYNC_MASTER") else BrokerRole.ASYNC_MASTER
            epoch = next_epoch(
                max([ha_state.last_epoch, client.master_epoch if client else 0, *(st.epoch for st in peers)]),
                self.config.broker_id,
            )
            # Forced while another master answers: it steps down first, so the two never take
            # writes at once; one that answers but does not step down stops the switch.
            await self._fence(live_masters, epoch)
            entry = await self._begin_term(role, epoch)
            log.warning(
                "promoted to %s, epoch %d, at CommitLog offset %d",
                role.value,
                entry.epoch,
                entry.start_offset,
            )
        return self.state()

    async def _begin_term(self, role: BrokerRole, epoch: int) -> EpochEntry:
        """Stop following, refill the de-duplication window from the log and begin master term
        ``epoch`` in ``role`` at the log's end (persisted before any put); saves the role."""
        await self._stop_client()
        self.port.forget_recent()
        if self.port.dedup is not None:
            await asyncio.to_thread(self.port.dedup.prefill, self.log)
        entry = await asyncio.to_thread(self.log.start_master_term, role, epoch)
        self.log.ha_state.save_role(role)
        return entry

    # -- the election's side (services.commitlog.election) --------------------------------------------
    async def take_master_term(self, role: BrokerRole, epoch: int, *, sync_state: frozenset[int]) -> None:
        """Elected: become the master of ``epoch`` in ``role``, every SYNC_MASTER put waiting for
        the slaves of ``sync_state`` (at first none: they join as they catch up)."""
        async with self._switch:
            self.log.ha_service.set_sync_state_set(sync_state)
            entry = await self._begin_term(role, epoch)
            log.warning(
                "elected %s, epoch %d, at CommitLog offset %d", role.value, entry.epoch, entry.start_offset
            )

    async def follow(self, master_address: str, epoch: int) -> None:
        """Follow the elected master's HA endpoint ``master_address`` (of ``epoch``), unless
        already following it."""
        client = self.client
        if (
            self.log.broker_role is BrokerRole.SLAVE
            and client is not None
            and client.master_address == master_address
        ):
            return
        await self.demote(master_address, epoch)

    async def step_down(self) -> None:
        """Stop being the master now (the lease ran out, or etcd names another): refuse puts,
        fail pending SYNC_MASTER waits, end the slaves' streams; follow nobody until told."""
        async with self._switch:
            if self.log.broker_role is BrokerRole.SLAVE:
                return
            await asyncio.to_thread(self.log.set_broker_role, BrokerRole.SLAVE)
            self.log.ha_service.set_sync_state_set(None)
            self.replication.end_streams()
            self.log.ha_state.save_role(BrokerRole.SLAVE)
            self.port.forget_recent()
            log.warning("stepped down: this store no longer takes puts")

    async def _promote_elected(self, force: bool) -> commitlog_pb.HAState:
        """A manual promotion under an election: ask the election, then wait (one lease TTL and
        a few checks) until it made this store the master. Raises RoleSwitchError."""
        election = self.election
        assert election is not None
        if election.may_acknowledge():
            return self.state()
        await election.promote(force=force)
        deadline = asyncio.get_running_loop().time() + election.ttl_s + 10 * election.interval_s
        while not election.may_acknowledge():
            if asyncio.get_running_loop().time() > deadline:
                election.cancel_promotion()
                raise RoleSwitchError("the election did not make this store the master; see its log")
            await asyncio.sleep(election.interval_s / 2)
        return self.state()

    async def _fence(self, masters: list[commitlog_pb.HAState], epoch: int) -> None:
        """Demote every member in ``masters`` (they answered as masters just now) to follow this
        store from ``epoch``. Raises RoleSwitchError naming the first that did not step down:
        promoting anyway would leave two masters taking writes (split brain)."""
        for st in masters:
            channel = self._channels.get(st.commitlog_address) or open_channel(st.commitlog_address, self.tls)
            self._channels[st.commitlog_address] = channel
            try:
                await RemoteCommitLog(channel, timeout_s=PEER_TIMEOUT_S).demote(self.ha_address, epoch)
            except (StoreError, grpc.RpcError) as exc:
                raise RoleSwitchError(
                    f"{st.commitlog_address} answers as the master but did not step down ({exc}); "
                    "not promoted: stop it first"
                ) from None

    async def demote(self, master_address: str, min_epoch: int = 0) -> commitlog_pb.HAState:
        """Make this store a SLAVE of ``master_address`` (an HA endpoint); returns the new state.
        A SLAVE asked to follow another master switches to it. Raises InvalidArgumentError."""
        if not master_address or ":" not in master_address:
            raise InvalidArgumentError("demote needs the new master's HA endpoint as host:port")
        if master_address == self.ha_address:
            raise InvalidArgumentError("a store cannot follow itself")
        if self.election is not None and self.election.leading is not None:
            # An operator's demotion of an elected master: it resigns, and the election (which
            # this store sits out for one lease TTL) picks the next master; this store then
            # follows whoever that is, whatever ``master_address`` said.
            await self.election.resign()
            return self.state()
        async with self._switch:
            if self.log.broker_role is BrokerRole.SLAVE:
                if self.client is None or self.client.master_address != master_address:
                    await self._stop_client()
                    self.log.ha_state.save_role(BrokerRole.SLAVE, master_address)
                    self._start_client(master_address, min_epoch=min_epoch)
                return self.state()
            log.warning("demoted: following %s", master_address)
            await self._become_slave(master_address, min_epoch)
        return self.state()

    # -- state --------------------------------------------------------------------------------------
    def state(self) -> commitlog_pb.HAState:
        log_ = self.log
        cfg = self.config
        client = self.client
        ha = log_.ha_service
        reply = commitlog_pb.HAState(
            broker_name=cfg.broker_name,
            broker_id=cfg.broker_id,
            broker_role=log_.broker_role.value,
            epoch=log_.ha_state.last_epoch,
            epochs=[
                commitlog_pb.EpochEntry(epoch=e.epoch, start_offset=e.start_offset)
                for e in log_.ha_state.epochs
            ],
            ha_address=self.ha_address,
            max_offset=log_.max_offset,
            confirm_offset=log_.confirm_offset,
            replicated_offset=ha.replicated_offset,
            commitlog_address=self.commitlog_address,
            in_sync_replicas=ha.required_slaves + 1,
        )
        if client is not None:
            reply.master_address = client.master_address
            reply.master_connected = client.connected
            reply.master_max_offset = client.master_max_offset
            reply.lag_bytes = client.lag_bytes
        for s in ha.lag():
            reply.slaves.append(
                commitlog_pb.SlaveState(
                    address=s.address,
                    broker_id=s.broker_id,
                    ack_offset=s.ack_offset,
                    lag_bytes=s.lag_bytes,
                    lag_ms=s.lag_ms,
                    in_sync=s.in_sync,
                    connected_ms=s.connected_ms,
                )
            )
        return reply
