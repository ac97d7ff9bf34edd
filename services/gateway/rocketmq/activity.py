"""What the RocketMQ 5 activities share (services.gateway.rocketmq: route, send, consume,
transaction, client): the gateway's ports and bounds, the ACL check, topic lookup and the
invisible-time bounds, and the helpers each call's answer is built with.

The activities split ``apache.rocketmq.v2.MessagingService`` as RocketMQ's proxy splits its
MessagingProcessor; services.gateway.rocketmq.messaging only dispatches to them.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from libstore.errors import AuthenticationError, PermissionDeniedError
from libstore.topic_config import TopicConfig
from services._common.telemetry import tracer
from services.gateway.acl import AccessControl, Account
from services.gateway.admission import ProduceAdmission
from services.gateway.limits import GatewayLimits, HeldPolls
from services.gateway.metrics import get_metrics
from services.gateway.rocketmq import convert
from services.gateway.rocketmq.convert import V2Error
from services.gateway.rocketmq.pb import Code, definition
from services.gateway.rocketmq.renewal import HandleRenewer
from services.gateway.rocketmq.sessions import ClientSessions
from services.gateway.signature import authenticate_v2, metadata_dict
from services.gateway.topic_cache import TopicCache
from services.ports import CommitLogPort, DispatchPort

NAMESPACE_HEADER = "x-mq-namespace"  # a client's resource namespace (services.gateway.rocketmq.namespace)
DEFAULT_INVISIBLE_MS = 60_000  # a push consumer's receive names no invisible time (the proxy's default)
# What a receive without auto-renewal may ask for (the proxy's minInvisibleTimeMillsForRecv and
# maxInvisibleTimeMills); a change of invisible time may go down to 0.
INVISIBLE_BOUNDS_MS = (10_000, 12 * 3600 * 1000)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def overall(statuses: list[definition.Status], what: str) -> definition.Status:
    """One status for several entries: OK when all are, the entry's own when there is one,
    else MULTIPLE_RESULTS."""
    failed = [s for s in statuses if s.code != Code.OK]
    if not failed:
        return convert.status()
    if len(statuses) == 1:
        return failed[0]
    return convert.status(Code.MULTIPLE_RESULTS, f"{len(failed)} of {len(statuses)} {what} failed")


def metadata(context: grpc.aio.ServicerContext, key: str) -> str:
    """The call's metadata value for ``key`` ("" when absent)."""
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode()
    return ""


def address(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) as (host, port). Raises ValueError for a bad port."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


class GatewayContext:
    """The gateway's side of every RocketMQ 5 call: its ports (``commitlog``, ``dispatch``), the
    topic cache, the ACL (None: off), bounds (``limits``, ``held_polls``, ``admission``), the
    clients' Telemetry sessions and the renewer of push consumers' invisible times, the
    invisible-time settings (ms), and the tasks that release what departed clients held."""

    def __init__(
        self,
        commitlog: CommitLogPort,
        dispatch: DispatchPort,
        *,
        endpoints: list[str],
        topics: TopicCache | None = None,
        broker_name: str = "broker-a",
        acl: AccessControl | None = None,
        default_invisible_ms: int = DEFAULT_INVISIBLE_MS,
        invisible_bounds_ms: tuple[int, int] = INVISIBLE_BOUNDS_MS,
        invisible_when_clear_ms: int = 1000,
        renew_ahead_ms: int = 10_000,
        renew_max_ms: int = 3 * 3600 * 1000,
        limits: GatewayLimits | None = None,
        held_polls: HeldPolls | None = None,
        admission: ProduceAdmission | None = None,
    ) -> None:
        self.commitlog = commitlog
        self.dispatch = dispatch
        self.endpoints = [address(e) for e in endpoints]
        self.topics = topics or TopicCache(commitlog)
        self.broker_name = broker_name
        self.acl = acl
        self.limits = limits = limits or GatewayLimits()
        self.held_polls = held_polls or HeldPolls(limits.max_held_polls, limits.max_held_polls_per_client)
        self.admission = admission or ProduceAdmission.of(limits)
        self.sessions = ClientSessions(
            max_streams=limits.telemetry_max_streams_per_client,
            outbox_max=limits.telemetry_outbox_max_commands,
        )
        self.default_invisible_ms = default_invisible_ms
        self.invisible_bounds_ms = invisible_bounds_ms
        self.invisible_when_clear_ms = invisible_when_clear_ms  # a departed client's deliveries
        self.releases: set[asyncio.Task[int]] = set()
        self.draining = False  # the gateway stops: streams end, what clients hold is not released
        self.renewer = HandleRenewer(
            dispatch,
            self.sessions.has_client,
            slice_ms=default_invisible_ms,
            ahead_ms=renew_ahead_ms,
            max_ms=renew_max_ms,
        )
        self.tracer = tracer("mqstore.gateway")
        self.metrics = get_metrics()

    def check_invisible(self, invisible_ms: int, least_ms: int) -> None:
        """Raise V2Error ILLEGAL_INVISIBLE_TIME outside [``least_ms``, maxInvisibleTimeMills]
        (the proxy's bounds and code)."""
        most_ms = self.invisible_bounds_ms[1]
        if invisible_ms < least_ms:
            raise V2Error(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"the invisible time {invisible_ms} ms is too small: at least {least_ms} ms "
                "(minInvisibleTimeMillsForRecv)",
            )
        if most_ms > 0 and invisible_ms > most_ms:
            raise V2Error(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"the invisible time {invisible_ms} ms is too large: at most {most_ms} ms "
                "(maxInvisibleTimeMills)",
            )

    def authorize(
        self, context: grpc.aio.ServicerContext, perm: int = 0, topic: str = "", group: str = ""
    ) -> Account | None:
        """With ACL on: the call must be signed by a known key (within the clock-skew window)
        holding ``perm`` (acl.PUB/SUB, both: either) on ``topic`` and consuming as ``group``;
        returns its account (None with the ACL off). Raises V2Error UNAUTHORIZED/FORBIDDEN."""
        if self.acl is None:
            return None
        try:
            account = authenticate_v2(self.acl, metadata_dict(context.invocation_metadata()))
            AccessControl.authorize(account, perm, topic, group)
        except AuthenticationError as exc:
            raise V2Error(Code.UNAUTHORIZED, str(exc)) from None
        except PermissionDeniedError as exc:
            raise V2Error(Code.FORBIDDEN, str(exc)) from None
        return account

    async def topic(self, name: str) -> TopicConfig:
        """The topic's config. Raises V2Error ILLEGAL_TOPIC (empty) or TOPIC_NOT_FOUND."""
        if not name:
            raise V2Error(Code.ILLEGAL_TOPIC, "topic name is empty")
        config = await self.topics.get(name)
        if config is None:
            raise V2Error(Code.TOPIC_NOT_FOUND, f"topic {name} does not exist")
        return config
