"""``mqstore serve``: run the embedded suite or one role of the split topology.

Embedded (the default): the four services in one process, wired through their local ports; the
gateway listens on 127.0.0.1:8081; data under ``<data>/commitlog``, ``<data>/dispatch`` and
``<data>/index``. Split: ``--role commitlog|dispatch|index|gateway`` runs one service on its own
address, reaching the others over gRPC (remote ports); each role's data lives directly in
``--data``. The same classes run in both.

Start order: the CommitLog recovers before anything listens; its HA controller settles the role
(services.commitlog.ha: a master replaced while it was away rejoins as a slave) and serves
slaves on the HA endpoint (``--ha-listen``; for ``--role commitlog`` by default its port + 1, as
RocketMQ's haListenPort); dispatch and index recover against its bounds and report SERVING once
they caught up with what it had confirmed at their start.

Replication: ``--broker-role ASYNC_MASTER|SYNC_MASTER|SLAVE``, ``--broker-name``,
``--broker-id`` and ``--ha-master`` (a slave's master HA endpoint) are StoreConfig keys;
``--ha-peers`` lists the other members' CommitLogService endpoints (role discovery and
fencing). A gateway given several comma-separated ``--commitlog``/``--dispatch``/``--index``
addresses treats them as the members of one broker group (services.gateway.broker_group).
Stop (SIGTERM/SIGINT): stop taking calls (health NOT_SERVING, then the servers drain), stop the
derived services (final flush and checkpoint), shut the CommitLog down (flush, checkpoint,
abort file removed) so the next start takes normal recovery.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from libstore import BrokerRole, CommitLog, ConfigError, StoreConfig
from libstore._os import physical_memory
from libstore.aio_deadline import wait_within
from services._common.errors import MethodWrapper
from services._common.mux import close_channel
from services._common.process_tuning import tune_allocator, tune_young_collections
from services._common.remote import open_channel
from services._common.server import MAX_MESSAGE_BYTES, GrpcServer, start_grpc_server
from services._common.telemetry import MetricsEndpoint, configure_tracing, start_metrics_endpoint
from services._common.tls import TlsConfig
from services.commitlog.etcd import parse_endpoints
from services.commitlog.ha import ElectionSettings, HAController
from services.commitlog.ha_server import add_to_server as add_replication
from services.commitlog.local import LocalCommitLog
from services.commitlog.servicer import CommitLogServicer
from services.commitlog.servicer import add_to_server as add_commitlog
from services.dispatch.app import DispatchApp
from services.dispatch.servicer import DispatchServicer
from services.dispatch.servicer import add_to_server as add_dispatch
from services.embedded import CommitLogNode, EmbeddedStore
from services.gateway.acl import AccessControl
from services.gateway.admission import ProduceAdmission
from services.gateway.caller import OwnApiAuth
from services.gateway.limits import GatewayLimits
from services.gateway.rocketmq.activity import GatewayContext
from services.gateway.rocketmq.messaging import MessagingServicer
from services.gateway.rocketmq.messaging import add_to_server as add_messaging
from services.gateway.servicer import GatewayServicer
from services.gateway.servicer import add_to_server as add_gateway
from services.index.app import IndexApp
from services.index.servicer import IndexServicer
from services.index.servicer import add_to_server as add_index
from services.ports import CommitLogPort, DispatchPort, IndexPort

log = logging.getLogger(__name__)

REQUEST_FRAMING_BYTES = 1024 * 1024  # a request's protobuf framing beyond its payload, at most
ROLES = ("embedded", "commitlog", "dispatch", "index", "gateway")
DEFAULT_ADDRESSES = {
    "embedded": "127.0.0.1:8081",
    "gateway": "127.0.0.1:8081",
    "commitlog": "127.0.0.1:10911",
    "dispatch": "127.0.0.1:10921",
    "index": "127.0.0.1:10931",
}


@dataclass
class ServeOptions:
    """What ``mqstore serve`` was asked to run. ``store`` holds StoreConfig keys (CLI flags and
    MQSTORE_* variables, already merged); ``conf_file`` a broker.conf-style file."""

    role: str = "embedded"
    data_dir: Path = Path("data")
    listen: str = ""
    commitlog: str = DEFAULT_ADDRESSES["commitlog"]
    dispatch: str = DEFAULT_ADDRESSES["dispatch"]
    index: str = DEFAULT_ADDRESSES["index"]
    store: Mapping[str, Any] = field(default_factory=dict)
    conf_file: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    catch_up_timeout_s: float = 600.0
    ha_listen: str = ""
    ha_peers: tuple[str, ...] = ()
    advertise: str = ""
    ha_advertise: str = ""
    acl_file: Path | None = None  # gateway: plain_acl.yml-style accounts for both client protocols
    tls: TlsConfig | None = None  # every port TLS; internal ports (and channels) mutual TLS with a CA
    health_listen: str = ""  # a plaintext health-only port (probes that cannot speak TLS)
    metrics_listen: str = ""  # a Prometheus scrape endpoint (services._common.telemetry); "" none
    # commitlog role: "etcd" elects the group's master through etcd (services.commitlog.election)
    election: str = ""
    etcd: str = ""  # host:port[,host:port...]
    etcd_prefix: str = "/mqstore"
    master_role: BrokerRole | None = None  # the role an elected member takes (default ASYNC_MASTER)

    @property
    def address(self) -> str:
        return self.listen or DEFAULT_ADDRESSES[self.role]

    @property
    def ha_address(self) -> str:
        """Where the HA (replication) server listens: ``ha_listen``, else for the commitlog role
        the service port + 1 (0 when that is 0); "" (no HA server) for the embedded suite unless
        asked."""
        if self.ha_listen:
            return self.ha_listen
        if self.role == "commitlog":
            host, _, port = self.address.rpartition(":")
            return f"{host}:{int(port) + 1 if int(port) else 0}"  # port 0: the kernel picks both
        return ""


def store_config(options: ServeOptions, root: Path) -> StoreConfig:
    """The StoreConfig of one service rooted at ``root`` (file < env < flags)."""
    overrides = dict(options.store)
    overrides["storePathRootDir"] = str(root)
    # Topics are created by hand in the split topology (RocketMQ's production advice).
    defaults = {} if options.role == "embedded" else {"autoCreateTopicEnable": False}
    return StoreConfig.from_sources(
        conf_file=options.conf_file, env=options.env, overrides=overrides, defaults=defaults
    )


class Suite:
    """The services of one process (see module docstring). ``await start()``; ``await stop()``."""

    def __init__(self, options: ServeOptions) -> None:
        if options.role not in ROLES:
            raise ValueError(f"unknown role {options.role!r}; choose one of {', '.join(ROLES)}")
        self.options = options
        self.embedded: EmbeddedStore | None = None
        self.node: CommitLogNode | None = None
        self.commit_log: CommitLog | None = None
        self.commitlog_port: LocalCommitLog | None = None
        self.ha: HAController | None = None
        self.ha_server: GrpcServer | None = None
        self.dispatch_app: DispatchApp | None = None
        self.index_app: IndexApp | None = None
        self.server: GrpcServer | None = None
        self.messaging: MessagingServicer | None = None
        self.admission: ProduceAdmission | None = None
        self._channels: list[grpc.aio.Channel] = []
        self._ready_task: asyncio.Task[None] | None = None
        self.metrics: MetricsEndpoint | None = None
        self._has_master = True  # with an election: whether the group has a master (health)

    @property
    def address(self) -> str:
        assert self.server is not None
        return self.server.address

    async def start(self) -> None:
        role = self.options.role
        configure_tracing("mqstore" if role == "embedded" else f"mqstore-{role}")
        self._warn_unauthenticated()
        if self.options.metrics_listen:
            try:
                self.metrics = start_metrics_endpoint(self.options.metrics_listen)
            except OSError as exc:
                raise OSError(f"cannot serve metrics on {self.options.metrics_listen}: {exc}") from exc
            log.info("mqstore %s: Prometheus metrics on http://%s/metrics", role, self.metrics.address)
        try:
            await self._start_role(role)
        except BaseException:
            if self.metrics is not None:
                self.metrics.close()
                self.metrics = None
            raise

    async def _start_role(self, role: str) -> None:
        data = Path(self.options.data_dir)
        if role == "embedded":
            self.embedded = await EmbeddedStore.open(
                data, store_config(self.options, data), **self._ha_args()
            )
            self.dispatch_app, self.index_app = self.embedded.dispatch, self.embedded.index
            commitlog = await self._adopt_commitlog(self.embedded.node)
            assert self.index_app is not None
            await self._start_gateway(
                commitlog, self.dispatch_app.port, self.index_app.port, self.dispatch_app.config
            )
            self._ready_task = asyncio.create_task(self._serving_when_caught_up())
        elif role == "commitlog":
            port = await self._start_commitlog(data)
            assert self.ha is not None
            servicer = CommitLogServicer(port, self.ha)
            self.server = await self._listen(self.options.address, lambda s: add_commitlog(servicer, s))
            await self.server.set_serving(self._has_master)
        elif role in ("dispatch", "index"):
            remote = self._remote_commitlog()
            await self._start_derived(data, remote)
            if role == "dispatch":
                assert self.dispatch_app is not None
                dispatch_servicer = DispatchServicer(self.dispatch_app.port)
                self.server = await self._listen(
                    self.options.address, lambda s: add_dispatch(dispatch_servicer, s)
                )
            else:
                assert self.index_app is not None
                index_servicer = IndexServicer(self.index_app.port)
                self.server = await self._listen(self.options.address, lambda s: add_index(index_servicer, s))
            self._ready_task = asyncio.create_task(self._serving_when_caught_up())
        else:  # gateway
            cfg = store_config(self.options, data)
            await self._start_gateway(*self._remote_group(cfg), cfg)
            assert self.server is not None
            await self.server.set_serving(True)
        assert self.server is not None
        log.info("mqstore %s serving on %s", role, self.server.address)
        if self.server.health_server is not None:
            log.info("mqstore %s: plaintext health on %s:%d", role, self.server.host, self.server.health_port)

    async def _start_gateway(
        self, commitlog: CommitLogPort, dispatch: DispatchPort, index: IndexPort, cfg: StoreConfig
    ) -> None:
        """The gateway's server: mqstore.v1.Gateway and apache.rocketmq.v2.MessagingService on one
        port, both advertising the same endpoint, both under the same accounts file when one is
        given (and both open, said loudly, when not)."""
        endpoints = [self.options.advertise or _advertised(self.options.address)]
        acl = AccessControl.load(self.options.acl_file) if self.options.acl_file else None
        if acl is None:
            log.warning(
                "gateway: no --acl-file: ANY client that reaches %s may produce, consume and "
                "administer (both protocols). Keep it on a trusted network or give it accounts.",
                self.options.address,
            )
        gateway = GatewayServicer(
            commitlog,
            dispatch,
            index,
            endpoints=endpoints,
            max_pull_batch=cfg.max_pull_batch_size,
            max_hold_ms=cfg.long_polling_hold_time,
            acl=acl,
            limits=GatewayLimits.from_config(cfg),
        )
        messaging = MessagingServicer(
            GatewayContext(
                commitlog,
                dispatch,
                endpoints=endpoints,
                topics=gateway.topics,
                broker_name=cfg.broker_name,
                acl=acl,
                default_invisible_ms=cfg.default_invisible_time,
                invisible_bounds_ms=(cfg.min_invisible_time_for_recv, cfg.max_invisible_time),
                invisible_when_clear_ms=cfg.invisible_time_when_clear,
                renew_ahead_ms=cfg.renew_ahead_time,
                renew_max_ms=cfg.renew_max_time,
                limits=gateway.limits,
                held_polls=gateway.held_polls,
                admission=gateway.admission,
            )
        )
        self.messaging = messaging
        self.admission = gateway.admission
        self.server = await self._listen(
            self.options.address,
            lambda s: add_gateway(gateway, s) + add_messaging(messaging, s),
            internal=False,
            wrappers=[OwnApiAuth(acl)] if acl is not None else (),
            # Clients' requests: refused by gRPC past maxRequestBytes (plus framing) before they
            # are read in whole; the gateway's own checks then name the bound.
            max_receive_bytes=min(MAX_MESSAGE_BYTES, cfg.max_request_bytes + REQUEST_FRAMING_BYTES),
        )

    def _remote_group(self, cfg: StoreConfig) -> tuple[CommitLogPort, DispatchPort, IndexPort]:
        """The gateway's ports: one member's remote ports, or a BrokerGroup over several."""
        from services.commitlog.client import RemoteCommitLog
        from services.dispatch.client import RemoteDispatch
        from services.gateway.broker_group import (
            BrokerGroup,
            GroupCommitLog,
            GroupDispatch,
            GroupIndex,
            Member,
        )
        from services.index.client import RemoteIndex

        lists = [_split(self.options.commitlog), _split(self.options.dispatch), _split(self.options.index)]
        if len({len(x) for x in lists}) != 1 or not lists[0]:
            raise ConfigError(
                "--commitlog, --dispatch and --index must list the same number of members, in the same order"
            )
        members = []
        for cl, dp, ix in zip(*lists, strict=True):
            tls = self.options.tls
            channels = [open_channel(cl, tls), open_channel(dp, tls), open_channel(ix, tls)]
            self._channels += channels
            members.append(
                Member(
                    cl,
                    RemoteCommitLog(channels[0]),
                    RemoteDispatch(channels[1]),
                    RemoteIndex(channels[2]),
                    probe=RemoteCommitLog(channels[0], timeout_s=1.0),
                )
            )
        if len(members) == 1:
            return members[0].commitlog, members[0].dispatch, members[0].index
        ratio = cfg.access_message_in_memory_max_ratio
        group = BrokerGroup(
            members,
            slave_read_enable=cfg.slave_read_enable,
            slave_read_lag_bytes=physical_memory() * ratio // 100,
        )
        return GroupCommitLog(group), GroupDispatch(group), GroupIndex(group)

    def _remote_commitlog(self) -> CommitLogPort:
        from services.commitlog.client import RemoteCommitLog

        channel = open_channel(self.options.commitlog, self.options.tls)
        self._channels.append(channel)
        return RemoteCommitLog(channel)

    def _ha_args(self) -> dict[str, Any]:
        options = self.options
        return {
            "ha_address": options.ha_advertise or _advertised(options.ha_address),
            "commitlog_address": options.advertise or _advertised(options.address),
            "peers": options.ha_peers,
            "tls": options.tls,
        }

    def _election(self) -> ElectionSettings | None:
        """The commitlog role's election settings (None without ``--election``). Raises
        ConfigError for an election elsewhere, an unknown kind or bad endpoints."""
        options = self.options
        if not options.election:
            return None
        if options.election != "etcd":
            raise ConfigError(f"--election takes etcd, got {options.election!r}")
        if options.role != "commitlog":
            raise ConfigError("--election is for the commitlog role (each member of a broker group)")
        return ElectionSettings(
            tuple(parse_endpoints(options.etcd)),
            master_role=options.master_role or BrokerRole.ASYNC_MASTER,
            prefix=options.etcd_prefix,
            unclean=False,  # enableElectUncleanMaster (the store key) decides
            on_serving=self._group_serving,
        )

    def _group_serving(self, serving: bool) -> None:
        """The election says whether the group has a master: the service's health follows."""
        self._has_master = serving
        if self.server is not None:
            asyncio.get_running_loop().create_task(self.server.set_serving(serving))

    async def _start_commitlog(self, root: Path) -> LocalCommitLog:
        """The commitlog role: a CommitLogNode (services.embedded) and its HA server."""
        node = await CommitLogNode.open(
            store_config(self.options, root), **self._ha_args(), election=self._election()
        )
        return await self._adopt_commitlog(node)

    async def _adopt_commitlog(self, node: CommitLogNode) -> LocalCommitLog:
        """Serve ``node``'s replication on the HA address, when there is one."""
        self.node = node
        self.commit_log, self.commitlog_port, self.ha = node.commit_log, node.port, node.ha
        ha_listen = self.options.ha_address
        try:
            if ha_listen:
                replication = node.ha.replication
                self.ha_server = await self._listen(
                    ha_listen, lambda s: add_replication(replication, s), health=False, call_mux=False
                )
                await self.ha_server.set_serving(True)
        except BaseException:
            await self._stop_commitlog()
            raise
        log.info(
            "commitlog: %s of broker group %s (epoch %d)%s",
            node.commit_log.broker_role.value,
            node.commit_log.config.broker_name,
            node.commit_log.ha_state.last_epoch,
            f", replication on {self.ha_server.address}" if self.ha_server is not None else "",
        )
        return node.port

    async def _listen(
        self,
        address: str,
        add_servicers: Callable[[grpc.aio.Server], list[str]],
        *,
        internal: bool = True,
        health: bool = True,
        call_mux: bool = True,
        wrappers: Sequence[MethodWrapper] = (),
        max_receive_bytes: int = MAX_MESSAGE_BYTES,
    ) -> GrpcServer:
        """A server on ``address`` with this process's TLS settings: an internal port (commitlog,
        dispatch, index, HA) requires client certificates whenever a CA is configured, the
        gateway port only with ``client_auth``. ``health``: also the plaintext health port, if set.
        ``call_mux``: an internal port also carries its unary methods on streams (services._common.mux)."""
        tls = self.options.tls
        verify = tls is not None and (tls.verifies_peers if internal else tls.client_auth)
        return await start_grpc_server(
            address,
            add_servicers,
            tls=tls,
            require_client_auth=verify,
            clients=not internal,
            health_address=self.options.health_listen if health else "",
            wrappers=wrappers,
            max_receive_bytes=max_receive_bytes,
            call_mux=internal and call_mux,
        )

    def _warn_unauthenticated(self) -> None:
        """Say loudly when internal RPCs (append, demote, replication) are open to anyone who connects."""
        options = self.options
        internal = [options.address] if options.role in ("commitlog", "dispatch", "index") else []
        if options.role in ("embedded", "commitlog") and options.ha_address:
            internal.append(options.ha_address)
        if not internal or (options.tls is not None and options.tls.verifies_peers):
            return
        why = "without TLS" if options.tls is None else "with TLS but without --tls-ca (no client certs)"
        log.warning(
            "SECURITY: %s serves internal RPCs on %s %s: anyone who can connect can append, read, "
            "replicate or switch roles. Keep these ports on a trusted network, or set --tls-cert, "
            "--tls-key and --tls-ca for mutual TLS.",
            options.role,
            ", ".join(internal),
            why,
        )

    async def _stop_commitlog(self) -> None:
        """Stop the HA server, then the derived services of an embedded store, then the CommitLog."""
        if self.ha_server is not None:
            await self.ha_server.stop(1.0)
            self.ha_server = None
        if self.embedded is not None:
            await self.embedded.close()
        elif self.node is not None:
            await self.node.close()
        self.embedded = self.node = self.commit_log = None

    async def _start_derived(self, data: Path, commitlog: CommitLogPort) -> None:
        """The dispatch or index role, following a remote CommitLog."""
        if self.options.role == "dispatch":
            self.dispatch_app = DispatchApp(store_config(self.options, data), commitlog)
            await self.dispatch_app.start()
        else:
            self.index_app = IndexApp(store_config(self.options, data), commitlog)
            await self.index_app.start()

    async def _serving_when_caught_up(self) -> None:
        timeout = self.options.catch_up_timeout_s
        for app in (self.dispatch_app, self.index_app):
            if app is not None and not await app.wait_caught_up(timeout):
                log.warning("%s has not caught up with the CommitLog after %.0f s", app.name, timeout)
        if self.server is not None:
            await self.server.set_serving(True)

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until the suite reports SERVING (derived services caught up)."""
        if self._ready_task is not None:
            await wait_within(asyncio.shield(self._ready_task), timeout_s)

    async def stop(self, grace_s: float = 5.0) -> None:
        if self._ready_task is not None:
            self._ready_task.cancel()
        if self.messaging is not None and self.server is not None:
            self.messaging.drain()
            await asyncio.sleep(0.1)  # let the streams send their last commands and complete
        if self.server is not None:
            await self.server.stop(grace_s)
        if self.messaging is not None:
            await self.messaging.close()
        if self.admission is not None:
            await self.admission.close()
        if self.embedded is None:  # the embedded store stops its own, in _stop_commitlog
            for app in (self.index_app, self.dispatch_app):
                if app is not None:
                    await app.stop()
        for channel in self._channels:
            await close_channel(channel)
        await self._stop_commitlog()
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.close)
            self.metrics = None


async def serve_forever(options: ServeOptions, ready: asyncio.Event | None = None) -> None:
    """Start a Suite, run until SIGTERM or SIGINT, then stop it gracefully."""
    tune_allocator()
    suite = Suite(options)
    await suite.start()
    # What is loaded by now (modules, descriptors, recovered state) lives as long as the
    # process: keep it out of every later full collection, whose pauses are request latency.
    gc.collect()
    gc.freeze()
    tune_young_collections()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        log.info("mqstore %s stopping", options.role)
        await suite.stop()


def _advertised(address: str) -> str:
    """``address`` as a peer on this machine reaches it (a wildcard host becomes 127.0.0.1)."""
    if not address:
        return ""
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("", "0.0.0.0", "[::]", "::") else address


def _split(addresses: str) -> list[str]:
    return [a.strip() for a in addresses.split(",") if a.strip()]
