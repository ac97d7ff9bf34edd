"""ElectionAgent: a broker group elects its master through etcd, fenced, without losing what a
SYNC_MASTER acknowledged (``mqstore serve --role commitlog --election etcd``; DESIGN "Failover").

We write no consensus: etcd (Raft) holds the group's state, and each commitlog member runs this
agent next to its HAController. Keys, under ``<prefix>/<brokerName>/``:

* ``members/<brokerId>`` — each member's JSON (addresses, its log's newest epoch and end, and
  ``syncedEpoch``: the master epoch it last caught up with in this process's lifetime), on the
  member's session lease: it vanishes when the member stops renewing.
* ``leader`` — the master's JSON (broker id, addresses, role, epoch), created by a transaction
  that finds the key absent, on the master's session lease. Whoever holds it is the master.
* ``epoch`` — the newest epoch an election began (no lease). A campaign begins
  ``next_epoch(max(every epoch seen), its broker id)`` in the same transaction that creates
  ``leader``, conditional on ``epoch`` being unchanged, so every election begins its own epoch
  and the store-level epoch checks fence a deposed master, as with a manual promotion.
* ``syncStateSet`` — ``{"epoch": E, "brokerIds": [...]}``: the master of epoch E and the slaves
  that hold every message it acknowledged (RocketMQ 5's SyncStateSet). The winner of a campaign
  writes ``{winner}`` once it has begun its epoch (until then the previous set stands, so a
  winner that dies on the way leaves the group electable); it adds a slave that has caught up
  (in its own memory first, where every SYNC_MASTER put then waits for that slave too, and only
  once the slave holds everything acknowledged before, in etcd) and removes one that
  disconnected or stayed behind for ``haMaxTimeSlaveNotCatchup`` ms (in etcd first, then in
  memory). So whoever etcd names holds every acknowledged message (libstore.ha_service).

Who may be elected once ``leader`` is gone (:func:`electable`): a live member named by the
SyncStateSet that caught up with its epoch's master since it last started (a restarted slave may
have lost what its page cache held), or that epoch's master itself; the furthest of them
(newest epoch, then longest log, then lowest broker id). With no such member the group stays
without a master and says so (health NOT_SERVING, ``mqstore.election.has_master`` 0, a log
line), unless ``enableElectUncleanMaster`` (``--unclean-election``) lets the furthest live
member win. The first election of a group (no SyncStateSet yet) waits up to
FIRST_ELECTION_GRACE_S for every member of ``--ha-peers`` and takes the furthest. The best
candidate campaigns once the group has been without a leader for two checks; the n-th best
after n more lease TTLs (the ones ahead of it may be stuck: a member whose checks stop for a
TTL also stops renewing its lease).

Fencing by time: the master renews its lease every third of its TTL and counts it valid until
``sent + TTL - margin`` (the lease cannot expire in etcd before the renewal it confirms was
sent, plus the TTL). :meth:`ElectionAgent.may_acknowledge` is False from then on: the commitlog
refuses puts and acknowledges none (services.commitlog.local), before etcd can let anyone else
win; the agent then steps down. A master that was paused (SIGSTOP) longer than its lease
acknowledges nothing when it resumes: the check reads the monotonic clock.

With the defaults (TTL 3 s, checks every 200 ms) a master that dies is replaced within about
TTL + 1 s; one that loses etcd stops acknowledging after TTL - 0.3 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.metrics import CallbackOptions, Observation

from libstore import BrokerRole, StoreError
from libstore.config import MAX_BROKER_ID
from libstore.ha_state import next_epoch
from services._common.telemetry import meter
from services.commitlog import etcd
from services.commitlog.etcd import EtcdCluster, EtcdLeaseNotFoundError, EtcdUnavailableError

if TYPE_CHECKING:
    from services.commitlog.ha import HAController

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/mqstore"
LEASE_MARGIN = 0.1  # share of the TTL a master gives up before its lease could expire in etcd
NO_MASTER_LOG_S = 10.0  # how often a group without a master says so
# A group's first election waits this long (s) for every member it knows of to show up.
FIRST_ELECTION_GRACE_S = 30.0
START_WAIT_S = 60.0  # how long a member waits for etcd at start before giving up
STOP_WAIT_S = 5.0  # how long stop() waits for the loops to end

_LIVE: weakref.WeakSet[ElectionAgent] = weakref.WeakSet()
_metrics_registered = False


@dataclass(frozen=True)
class MemberInfo:
    """A member as it published itself (``members/<id>``)."""

    broker_id: int
    commitlog_address: str
    ha_address: str
    epoch: int  # the newest epoch in its log's history
    max_offset: int
    synced_epoch: int  # master epoch it caught up with since it started (0: none yet)
    standby: bool = False  # an operator demoted it: others go first for a while

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "brokerId": self.broker_id,
                "commitlogAddress": self.commitlog_address,
                "haAddress": self.ha_address,
                "epoch": self.epoch,
                "maxOffset": self.max_offset,
                "syncedEpoch": self.synced_epoch,
                "standby": self.standby,
            }
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> MemberInfo:
        d = json.loads(raw)
        return cls(
            int(d["brokerId"]),
            str(d["commitlogAddress"]),
            str(d["haAddress"]),
            int(d["epoch"]),
            int(d["maxOffset"]),
            int(d["syncedEpoch"]),
            bool(d.get("standby", False)),
        )


@dataclass(frozen=True)
class LeaderInfo:
    """The master as its ``leader`` key says, with the key's creation revision and lease."""

    broker_id: int
    commitlog_address: str
    ha_address: str
    role: str
    epoch: int
    create_revision: int = 0
    lease: int = 0

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "brokerId": self.broker_id,
                "commitlogAddress": self.commitlog_address,
                "haAddress": self.ha_address,
                "role": self.role,
                "epoch": self.epoch,
            }
        ).encode()

    @classmethod
    def from_key(cls, kv: etcd.KeyValue) -> LeaderInfo:
        d = json.loads(kv.value)
        return cls(
            int(d["brokerId"]),
            str(d["commitlogAddress"]),
            str(d["haAddress"]),
            str(d["role"]),
            int(d["epoch"]),
            kv.create_revision,
            kv.lease,
        )


@dataclass(frozen=True)
class GroupView:
    """One consistent read of a group's keys (at ``revision``)."""

    revision: int
    leader: LeaderInfo | None
    epoch: int  # the ``epoch`` key (0: no election yet)
    epoch_mod: int  # its mod revision (0: absent), for the campaign's compare
    sync_state: tuple[int, frozenset[int]] | None  # (epoch, broker ids), None: none yet
    members: dict[int, MemberInfo]


def parse_view(prefix: bytes, revision: int, kvs: list[etcd.KeyValue]) -> GroupView:
    """A GroupView from the keys read under ``prefix``; malformed keys are ignored (logged)."""
    leader = None
    epoch = epoch_mod = 0
    sync_state: tuple[int, frozenset[int]] | None = None
    members: dict[int, MemberInfo] = {}
    for kv in kvs:
        name = kv.key[len(prefix) :].decode("utf-8", "replace")
        try:
            if name == "leader":
                leader = LeaderInfo.from_key(kv)
            elif name == "epoch":
                epoch, epoch_mod = int(kv.value), kv.mod_revision
            elif name == "syncStateSet":
                # Unreadable, it names nobody (not "no set yet": that would open a first,
                # unclean election).
                sync_state = (0, frozenset())
                d = json.loads(kv.value)
                sync_state = (int(d["epoch"]), frozenset(int(b) for b in d["brokerIds"]))
            elif name.startswith("members/"):
                info = MemberInfo.from_json(kv.value)
                members[info.broker_id] = info
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("election: ignoring malformed key %s: %s", kv.key.decode("utf-8", "replace"), exc)
    return GroupView(revision, leader, epoch, epoch_mod, sync_state, members)


def electable(view: GroupView, *, unclean: bool = False) -> list[MemberInfo]:
    """The live members that may become the master now, the one that should first (module
    docstring): named by the SyncStateSet and caught up with its epoch since they started, or
    that epoch's master itself; every live member when the group never elected (no set yet) or
    with ``unclean``. Ordered by newest epoch, then longest log, then lowest broker id; members
    an operator just demoted (standby) after all others."""
    live = list(view.members.values())
    if unclean or view.sync_state is None:
        pool = live
    else:
        set_epoch, ids = view.sync_state
        pool = [
            m
            for m in live
            if (m.broker_id in ids and m.synced_epoch == set_epoch)
            or (m.epoch == set_epoch and set_epoch % MAX_BROKER_ID == m.broker_id)
        ]
    return sorted(pool, key=lambda m: (m.standby, -m.epoch, -m.max_offset, m.broker_id))


def _register_metrics() -> None:
    global _metrics_registered
    if _metrics_registered:
        return
    _metrics_registered = True
    m = meter("mqstore.election")

    def gauge(value: Callable[[ElectionAgent], int]) -> Callable[[CallbackOptions], list[Observation]]:
        def observe(_options: CallbackOptions) -> list[Observation]:
            return [
                Observation(value(a), {"broker_name": a.config.broker_name, "broker_id": a.config.broker_id})
                for a in list(_LIVE)
            ]

        return observe

    m.create_observable_gauge(
        "mqstore.election.leader",
        [gauge(lambda a: int(a.may_acknowledge()))],
        description="1 while this member holds its group's leadership (and its lease)",
    )
    m.create_observable_gauge(
        "mqstore.election.has_master",
        [gauge(lambda a: int(a.group_has_master))],
        description="1 while this member's broker group has a master in etcd",
    )


class ElectionAgent:
    """One member's side of the election (module docstring), driving ``ha`` (its HAController).

    ``master_role``: the role an elected member takes (ASYNC_MASTER or SYNC_MASTER);
    ``unclean``: enableElectUncleanMaster; ``on_serving``: told whether the group has a master
    (the service's health). Start with :meth:`start`, end with :meth:`stop`."""

    def __init__(
        self,
        ha: HAController,
        cluster: EtcdCluster,
        *,
        master_role: BrokerRole,
        prefix: str = DEFAULT_PREFIX,
        unclean: bool = False,
        on_serving: Callable[[bool], None] | None = None,
    ) -> None:
        if master_role is BrokerRole.SLAVE:
            raise ValueError("the elected role is ASYNC_MASTER or SYNC_MASTER")
        self.ha = ha
        self.cluster = cluster
        self.config = ha.config
        self.master_role = master_role
        self.unclean = unclean
        self.on_serving = on_serving
        self.prefix = f"{prefix.rstrip('/')}/{self.config.broker_name}/".encode()
        self.ttl_s = max(2, -(-self.config.election_lease_ttl_millis // 1000))
        self.interval_s = self.config.election_check_interval_millis / 1000.0
        self.lease = 0
        self._valid_until = 0.0  # monotonic: the lease holds until then (see module docstring)
        self.leading: LeaderInfo | None = None  # our leader key while we hold it
        self.synced_epoch = 0
        self.group_has_master = False
        self.view: GroupView | None = None
        self._published = b""
        self._leaderless_since: float | None = None
        self._resigned_until = 0.0  # after a manual demote: do not campaign before this
        self._force_next = False  # a manual promote: campaign once whatever the SyncStateSet says
        self._last_no_master_log = 0.0
        self._serving: bool | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False  # stop() was called: the loops end at their next turn
        self._changed = asyncio.Event()
        self._session_lock = asyncio.Lock()
        self._last_check = time.monotonic()  # when the check loop last finished a check
        self._started = time.monotonic()
        self._serving_task: asyncio.Task[None] | None = None
        _register_metrics()
        _LIVE.add(self)

    # -- keys -----------------------------------------------------------------------------------------
    def _key(self, name: str) -> bytes:
        return self.prefix + name.encode()

    @property
    def broker_id(self) -> int:
        return self.config.broker_id

    # -- life -----------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open a session (lease), publish this member, and start following the group's state.
        Waits up to START_WAIT_S for etcd (it may be starting too, in a new deployment); raises
        EtcdUnavailableError when it cannot be reached by then."""
        deadline = time.monotonic() + START_WAIT_S
        delay = 0.2
        while True:
            try:
                await self._new_session()
                break
            except EtcdUnavailableError as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("election: etcd not reachable yet (%s); trying again in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        self._tasks = [
            asyncio.get_running_loop().create_task(self._keep_alive(), name="election-lease"),
            asyncio.get_running_loop().create_task(self._follow(), name="election"),
        ]

    async def stop(self) -> None:
        """Stop taking part: resign leadership, end the session (its keys go with it). Returns
        within STOP_WAIT_S whatever the loops are doing (a shutdown must not hang on etcd)."""
        _LIVE.discard(self)
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # Python 3.11's wait_for can swallow a cancellation that meets a finishing call;
            # the flag ends such a loop at its next turn, and the wait is bounded either way.
            _, pending = await asyncio.wait(self._tasks, timeout=STOP_WAIT_S)
            for task in pending:
                log.error("election: %s did not stop within %.0f s; leaving it", task.get_name(), STOP_WAIT_S)
        self._tasks = []
        # Acknowledge nothing from here on, then let the others elect at once (the lease's keys
        # go with it) instead of after the TTL.
        self.leading = None
        self._valid_until = 0.0
        if self.lease:
            with contextlib.suppress(EtcdUnavailableError):
                await self.cluster.revoke(self.lease)
        await self.cluster.close()

    async def _new_session(self) -> None:
        sent = time.monotonic()
        self.lease = await self.cluster.grant(self.ttl_s)
        self._valid_until = sent + self.ttl_s * (1 - LEASE_MARGIN)
        self._published = b""
        await self._publish_member()
        log.info(
            "election: member %d joined broker group %s in etcd", self.broker_id, self.config.broker_name
        )

    # -- fencing --------------------------------------------------------------------------------------
    def holds_lease(self) -> bool:
        """True while this member's session lease surely holds in etcd (monotonic clock)."""
        return time.monotonic() < self._valid_until

    def may_acknowledge(self) -> bool:
        """True while this member leads the group on its current session's lease and that
        lease surely holds: the commitlog accepts and acknowledges puts only then."""
        leading = self.leading
        return leading is not None and leading.lease == self.lease and self.holds_lease()

    async def _keep_alive(self) -> None:
        """Renew the lease every TTL/3; a lease that expired starts a new session (and ends any
        leadership); one that cannot be renewed in time ends leadership at its deadline."""
        while not self._stopping:
            sent = time.monotonic()
            renewed = False
            try:
                if sent - self._last_check > self.ttl_s:
                    # The check loop is stuck (a stalled disk under a role switch, a held
                    # lock): a member that cannot act must not keep its leadership, nor its
                    # place as a candidate, by renewing from here. Let the lease run out.
                    log.error(
                        "election: no check completed for %.1f s; not renewing the lease",
                        sent - self._last_check,
                    )
                    if self.leading is not None and not self.holds_lease():
                        await self._lost_leadership("its checks are stuck and its lease ran out")
                else:
                    renewed = await self._renew(sent)
            except Exception:  # the renewals must outlive any one failure
                log.exception("election: renewing the lease failed")
            # A renewal that failed is tried again soon: the lease is running out meanwhile.
            pause = self.ttl_s / 3.0 if renewed else self.interval_s
            await asyncio.sleep(max(pause - (time.monotonic() - sent), 0.05))

    async def _renew(self, sent: float) -> bool:
        """One renewal; True when the lease was renewed."""
        lease = self.lease
        try:
            ttl = await self.cluster.keep_alive(lease)
        except EtcdUnavailableError as exc:
            log.warning("election: cannot renew the lease (%s)", exc)
            ttl = -1
        if ttl > 0 and lease == self.lease:
            self._valid_until = sent + ttl * (1 - LEASE_MARGIN)
        elif ttl == 0:
            log.warning("election: the session lease expired in etcd; starting a new session")
            await self._restart_session(lease)
        if self.leading is not None and not self.holds_lease():
            await self._lost_leadership("its lease could not be renewed in time")
        return ttl > 0

    async def _restart_session(self, expired: int) -> None:
        """Lease ``expired`` is gone in etcd: if it is still this member's session, end any
        leadership and open a new session (once, even when both loops find out together)."""
        async with self._session_lock:
            if self.lease != expired:
                return  # a stale answer about a session already replaced
            self._valid_until = 0.0
            await self._lost_leadership("its lease expired")
            with contextlib.suppress(EtcdUnavailableError):
                await self._new_session()

    async def _lost_leadership(self, why: str) -> None:
        if self.leading is None:
            return
        log.warning("election: member %d steps down as master: %s", self.broker_id, why)
        self.leading = None
        await self.ha.step_down()
        self._changed.set()

    # -- the loop -------------------------------------------------------------------------------------
    async def _follow(self) -> None:
        while not self._stopping:
            lease = self.lease
            try:
                await self._tick()
            except EtcdLeaseNotFoundError:
                log.warning("election: the session lease is gone in etcd; starting a new session")
                await self._restart_session(lease)
            except EtcdUnavailableError as exc:
                log.warning("election: etcd unreachable (%s)", exc)
                if self.leading is not None and not self.holds_lease():
                    await self._lost_leadership("etcd is unreachable and the lease ran out")
            except StoreError as exc:
                log.warning("election: %s", exc)
            except Exception:  # the loop must outlive any one bad check
                log.exception("election: the check failed")
            self._last_check = time.monotonic()
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._changed.wait()

    async def read_view(self) -> GroupView:
        revision, kvs = await self.cluster.read_prefix(self.prefix)
        view = parse_view(self.prefix, revision, kvs)
        self.view = view
        return view

    async def _tick(self) -> None:
        view = await self.read_view()
        leader = view.leader
        self.group_has_master = leader is not None
        if leader is not None:
            self._force_next = False  # a forced promotion applies to the election it was asked for
        if leader is not None and leader.lease == self.lease and leader.broker_id == self.broker_id:
            await self._lead(view, leader)
        elif leader is not None:
            self._leaderless_since = None
            if leader.broker_id == self.broker_id:
                # Our own key from a session that ended (this process restarted within the
                # TTL, or lost its lease): clear it so that the group elects at once.
                await self.cluster.transaction(
                    [etcd.Create(self._key("leader")) == leader.create_revision],
                    [etcd.Delete(self._key("leader"))],
                )
                self._changed.set()
                return
            await self._lost_leadership(f"member {leader.broker_id} leads epoch {leader.epoch}")
            await self._follow_leader(leader)
            self._set_serving(True)
        else:
            await self._lost_leadership("the group's leader key is gone")
            await self._elect(view)
        await self._publish_member()

    async def _follow_leader(self, leader: LeaderInfo) -> None:
        await self.ha.follow(leader.ha_address, leader.epoch)
        client = self.ha.client
        if (
            client is not None
            and client.master_address == leader.ha_address
            and client.caught_up_epoch == leader.epoch
            and self.synced_epoch != leader.epoch
        ):
            self.synced_epoch = leader.epoch
            log.info("election: caught up with the master of epoch %d", leader.epoch)

    async def _elect(self, view: GroupView) -> None:
        now = time.monotonic()
        if self._leaderless_since is None:
            self._leaderless_since = now
            return  # publish a fresh log end first; decide on the next check
        candidates = electable(view, unclean=self.unclean or self._force_next)
        if not candidates:
            self._set_serving(False)
            if now - self._last_no_master_log >= NO_MASTER_LOG_S:
                self._last_no_master_log = now
                ids = sorted(view.sync_state[1]) if view.sync_state else []
                log.error(
                    "election: broker group %s has no master and no member that may become one "
                    "(SyncStateSet of epoch %d: %s; live members: %s); waiting for one of them, or "
                    "set enableElectUncleanMaster (--unclean-election) to accept losing acknowledged "
                    "messages",
                    self.config.broker_name,
                    view.sync_state[0] if view.sync_state else 0,
                    ids,
                    sorted(view.members),
                )
            return
        waited = now - self._leaderless_since
        if view.sync_state is None and not self._force_next:
            # A group's first election: nobody is named yet, so wait for every member this one
            # knows of (--ha-peers), or for a grace period, lest a member that starts fast
            # win over one still recovering a longer log.
            expected = 1 + len(self.ha.peers)
            if len(view.members) < expected and now - self._started < FIRST_ELECTION_GRACE_S:
                return
        ids = [m.broker_id for m in candidates]
        if self._force_next and self.broker_id in view.members:
            rank = 0
        elif self.broker_id in ids:
            # The first candidate campaigns; the next ones after a lease TTL each, in case
            # those ahead of them cannot (a stuck member keeps its member key alive).
            rank = ids.index(self.broker_id)
        else:
            return
        if (
            waited >= 2 * self.interval_s + rank * self.ttl_s
            and now >= self._resigned_until
            and self.holds_lease()
        ):
            await self._campaign(view)

    async def _campaign(self, view: GroupView) -> None:
        log_ = self.ha.log
        known = max([view.epoch, log_.ha_state.last_epoch, *(m.epoch for m in view.members.values())])
        epoch = next_epoch(known, self.broker_id)
        leader = LeaderInfo(
            self.broker_id,
            self.ha.commitlog_address,
            self.ha.ha_address,
            self.master_role.value,
            epoch,
        )
        lease = self.lease
        try:
            # The SyncStateSet stays as it is until this member has begun the epoch: whoever
            # it names may still be elected should this member not get that far.
            won = await self.cluster.transaction(
                [etcd.Version(self._key("leader")) == 0, etcd.Mod(self._key("epoch")) == view.epoch_mod],
                [
                    etcd.Put(self._key("leader"), leader.to_json(), lease),
                    etcd.Put(self._key("epoch"), str(epoch).encode()),
                ],
            )
        finally:
            self._force_next = False
        if not won:
            return
        revision, kvs = await self.cluster.read_prefix(self.prefix)
        mine = parse_view(self.prefix, revision, kvs).leader
        if mine is None or mine.lease != lease or lease != self.lease:
            return  # the session changed meanwhile: the next check resigns the key, if it stands
        self.leading = mine
        try:
            await self.ha.take_master_term(self.master_role, epoch, sync_state=frozenset())
            if not await self._publish_sync_state(mine, set()):
                raise RuntimeError("the leader key was gone before the SyncStateSet was written")
        except BaseException as exc:
            log.error(
                "election: member %d won epoch %d but could not take it up: %s", self.broker_id, epoch, exc
            )
            await self._lost_leadership(f"taking up epoch {epoch} failed")
            await self._resign(mine.create_revision)
            if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
                raise
            return
        if not self.may_acknowledge():
            return  # stepped down meanwhile (its lease)
        self.synced_epoch = epoch
        self._leaderless_since = None
        self._set_serving(True)
        log.warning(
            "election: member %d is the master of broker group %s, epoch %d",
            self.broker_id,
            self.config.broker_name,
            epoch,
        )

    async def _lead(self, view: GroupView, leader: LeaderInfo) -> None:
        if self.leading is None:  # our key, but we stepped down since (or never took the term)
            await self._resign(leader.create_revision)
            return
        self._set_serving(True)
        await self._maintain_sync_state(view, leader)

    async def _resign(self, create_revision: int) -> None:
        """Delete the leader key created at ``create_revision`` (ours), if it still stands."""
        with contextlib.suppress(EtcdUnavailableError):
            await self.cluster.transaction(
                [etcd.Create(self._key("leader")) == create_revision], [etcd.Delete(self._key("leader"))]
            )
        self._changed.set()

    # -- the SyncStateSet -----------------------------------------------------------------------------
    async def _maintain_sync_state(self, view: GroupView, leader: LeaderInfo) -> None:
        """Shrink the set by slaves that left or stayed behind (etcd first), or grow it by one
        slave that caught up (memory first, etcd once it holds every acknowledged message)."""
        ha = self.ha.log.ha_service
        members = set(ha.sync_state_set or ())
        limit_ms = self.config.ha_max_time_slave_not_catchup
        slaves: dict[int, tuple[int, int]] = {}  # broker id -> (ack offset, lag ms), best connection
        for s in ha.lag():
            ack, lag = slaves.get(s.broker_id, (-1, 1 << 62))
            slaves[s.broker_id] = (max(ack, s.ack_offset), min(lag, s.lag_ms))
        gone = {b for b in members if b not in slaves or slaves[b][1] > limit_ms}
        if gone:
            keep = members - gone
            if await self._publish_sync_state(leader, keep):
                ha.set_sync_state_set(frozenset(keep))
                log.warning(
                    "election: SyncStateSet of epoch %d shrinks by %s to %s",
                    leader.epoch,
                    sorted(gone),
                    sorted(keep),
                )
            return
        published = view.sync_state
        if published != (leader.epoch, frozenset({self.broker_id, *members})):
            # etcd says something else than memory (a write whose outcome was unknown): every
            # slave in memory holds what was acknowledged since it joined (puts waited for it),
            # so publishing memory is right either way.
            await self._publish_sync_state(leader, members)
            return
        for broker_id, (_, lag_ms) in sorted(slaves.items()):
            if broker_id in members or broker_id == self.broker_id or lag_ms > limit_ms // 2:
                continue
            acked = ha.replicated_offset  # every acknowledged put ends at or before it
            ha.set_sync_state_set(frozenset(members | {broker_id}))  # from now on puts wait for it
            ack = max((s.ack_offset for s in ha.lag() if s.broker_id == broker_id), default=-1)
            if ack < acked:
                ha.set_sync_state_set(frozenset(members))  # it lacks something acknowledged
            elif not await self._publish_sync_state(leader, members | {broker_id}):
                ha.set_sync_state_set(frozenset(members))  # no longer the leader
            else:
                log.info("election: SyncStateSet of epoch %d grows by %d", leader.epoch, broker_id)
            # A publish whose outcome is unknown raises: memory keeps the slave (waiting for more
            # than etcd names is safe) and the next check publishes memory again.
            return

    async def _publish_sync_state(self, leader: LeaderInfo, slaves: set[int]) -> bool:
        """Write the set (this master and ``slaves``) while our leader key stands."""
        return await self.cluster.transaction(
            [etcd.Create(self._key("leader")) == leader.create_revision],
            [etcd.Put(self._key("syncStateSet"), _sync_state_json(leader.epoch, {self.broker_id, *slaves}))],
        )

    # -- publishing -----------------------------------------------------------------------------------
    async def _publish_member(self) -> None:
        log_ = self.ha.log
        info = MemberInfo(
            self.broker_id,
            self.ha.commitlog_address,
            self.ha.ha_address,
            log_.ha_state.last_epoch,
            log_.max_offset,
            self.synced_epoch,
            standby=time.monotonic() < self._resigned_until,
        ).to_json()
        if info != self._published:
            await self.cluster.put(self._key(f"members/{self.broker_id}"), info, lease=self.lease)
            self._published = info

    def _set_serving(self, serving: bool) -> None:
        if serving != self._serving:
            self._serving = serving
            if self.on_serving is not None:
                self.on_serving(serving)

    # -- operators ------------------------------------------------------------------------------------
    def leader_ha_address(self) -> str:
        """The current master's HA endpoint as last read ("" when none)."""
        view = self.view
        return view.leader.ha_address if view is not None and view.leader is not None else ""

    async def promote(self, *, force: bool) -> None:
        """A manual promotion goes through the election: refused (RoleSwitchError) while another
        member leads; otherwise this member campaigns at the next check, and with ``force`` even
        when the SyncStateSet does not name it (an unclean election of this member)."""
        from libstore import RoleSwitchError

        view = await self.read_view()
        if view.leader is not None and view.leader.lease != self.lease:
            raise RoleSwitchError(
                f"member {view.leader.broker_id} leads epoch {view.leader.epoch} through the election; "
                "demote it (it resigns) or stop it, and the election picks the next master"
            )
        if view.leader is None and not force and self.broker_id not in [m.broker_id for m in electable(view)]:
            raise RoleSwitchError(
                "this member may not be elected: it is not in the SyncStateSet or has not caught up "
                "with its master since it started; force the switch to elect it anyway (unclean)"
            )
        self._force_next = force
        self._resigned_until = 0.0
        self._leaderless_since = self._leaderless_since or time.monotonic() - 2 * self.interval_s
        self._changed.set()

    def cancel_promotion(self) -> None:
        """A manual promotion gave up: the election it asked for must not stay forced."""
        self._force_next = False

    async def resign(self) -> None:
        """A manual demotion of the master: give up leadership and stay out of the next
        election for one lease TTL, so that another member wins it."""
        leading = self.leading
        if leading is None:
            return
        self._resigned_until = time.monotonic() + self.ttl_s
        await self._lost_leadership("an operator demoted it")
        with contextlib.suppress(EtcdUnavailableError):
            await self._publish_member()  # standby, before the others decide
        await self._resign(leading.create_revision)


def _sync_state_json(epoch: int, broker_ids: set[int]) -> bytes:
    return json.dumps({"epoch": epoch, "brokerIds": sorted(broker_ids)}).encode()
