"""EtcdCluster: the etcd a broker group elects its master through, as one client over several
endpoints (services.commitlog.election).

The client library is aetcd (asyncio, etcd's v3 gRPC API). It talks to one endpoint; this class
keeps one client per endpoint and, when a call finds its endpoint unreachable (refused, or no
answer within ``timeout_s``: a member that lost the cluster's quorum does not answer writes),
moves on to the next and tries again, so losing one member of a three-member etcd costs a call
one timeout at most. Every call has a deadline; a call that no endpoint answers raises
:class:`EtcdUnavailableError`.

Only what the election needs: a consistent read of a key prefix (with the revision it was read
at), transactions (compare and swap), puts and deletes, and session leases (grant, one
keep-alive, revoke).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
import grpc
from aetcd import transactions as tx

from libstore import ConfigError, ServiceNotAvailableError
from libstore.aio_deadline import wait_within

log = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 1.0
# What an unreachable or quorum-less endpoint raises: try the next one.
_UNREACHABLE = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.InternalError,
    asyncio.TimeoutError,
    OSError,
)

# Transaction operations and comparisons (aetcd's): re-exported so callers import one module.
Version, Mod, Create, Value = tx.Version, tx.Mod, tx.Create, tx.Value
Put, Delete, Get = tx.Put, tx.Delete, tx.Get


class EtcdUnavailableError(ServiceNotAvailableError):
    """No etcd endpoint answered within the deadline (all down, or no quorum), or one refused
    the request for a reason of its own (:attr:`code`)."""

    reason = "ETCD_UNAVAILABLE"


class EtcdLeaseNotFoundError(EtcdUnavailableError):
    """The lease a request named has expired (or was revoked): start a new session."""


class EtcdOutcomeUnknownError(EtcdUnavailableError):
    """A transaction got no answer: etcd may or may not have applied it (read it back)."""


@dataclass(frozen=True)
class KeyValue:
    """One key as read: ``value`` bytes, the revisions that created and last changed it, and the
    lease it lives on (0: none)."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """``host:port[,host:port...]`` (an ``http://`` prefix is accepted) as (host, port) pairs.
    Raises ConfigError for an empty list or a malformed endpoint."""
    out = []
    for part in text.split(","):
        part = part.strip().removeprefix("http://")
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"etcd endpoints are host:port,host:port..., got {part!r}")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ConfigError("no etcd endpoint given (--etcd host:port[,host:port...])")
    return out


class EtcdCluster:
    """Calls to whichever of ``endpoints`` answers (see module docstring). ``timeout_s``: the
    deadline of one call to one endpoint."""

    def __init__(self, endpoints: Sequence[tuple[str, int]], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not endpoints:
            raise ConfigError("no etcd endpoint given")
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self._clients: list[aetcd.Client | None] = [None] * len(self.endpoints)
        self._retired: set[asyncio.Task[None]] = set()
        self._current = 0

    def _client(self, i: int) -> aetcd.Client:
        client = self._clients[i]
        if client is None:
            host, port = self.endpoints[i]
            # aetcd applies ``timeout`` to every call (whole seconds are not required).
            client = self._clients[i] = aetcd.Client(host, port, timeout=self.timeout_s)
        return client

    async def _call(
        self, what: str, call: Callable[[aetcd.Client], Awaitable[T]], *, idempotent: bool = True
    ) -> T:
        """``call`` on the current endpoint's client, then on each other one in turn. A call
        that is not ``idempotent`` (a transaction) is not sent again after one that may have
        been applied: it raises EtcdOutcomeUnknownError, and the caller reads the state back."""
        n = len(self.endpoints)
        last: BaseException | None = None
        for step in range(n):
            i = (self._current + step) % n
            client = self._client(i)
            try:
                try:
                    result = await wait_within(call(client), self.timeout_s * 2)
                finally:
                    _raise_if_cancelling()
            except _UNREACHABLE as exc:
                last = exc
                self._drop(i)
                if not idempotent:
                    raise EtcdOutcomeUnknownError(f"etcd {what}: no answer ({exc!r})") from None
                continue
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # our caller is being cancelled
                last = exc  # the client's channel was closed under this call: try another
                self._drop(i)
                if not idempotent:
                    raise EtcdOutcomeUnknownError(f"etcd {what}: the call was cut off") from None
                continue
            except (grpc.aio.AioRpcError, aetcd.exceptions.ClientError) as exc:
                # etcd refused it. aetcd raises a ClientError for the codes it does not map,
                # the gRPC error as its cause.
                cause = exc if isinstance(exc, grpc.aio.AioRpcError) else exc.__cause__
                if (
                    isinstance(cause, grpc.aio.AioRpcError)
                    and cause.code() is grpc.StatusCode.NOT_FOUND
                    and "lease not found" in (cause.details() or "")
                ):
                    raise EtcdLeaseNotFoundError(f"etcd {what}: the lease has expired") from None
                raise EtcdUnavailableError(f"etcd {what}: {exc!r}") from None
            if i != self._current:
                log.info("etcd: now using %s:%d", *self.endpoints[i])
                self._current = i
            return result
        raise EtcdUnavailableError(f"etcd {what}: no endpoint answered ({last!r})")

    def _drop(self, i: int) -> None:
        """Forget endpoint ``i``'s client (its channel may be stuck on a dead member); it is
        closed once the calls still using it have run into their deadlines (closing it now
        would cancel them)."""
        client, self._clients[i] = self._clients[i], None
        if client is not None:
            self._retired.add(asyncio.get_running_loop().create_task(self._close_later(client, i)))

    async def _close_later(self, client: aetcd.Client, i: int) -> None:
        try:
            await asyncio.sleep(self.timeout_s * 3)
            await wait_within(client.close(), self.timeout_s)
        except Exception:  # a client that cannot even close is dropped all the same
            log.debug("etcd: closing the client of %s:%d failed", *self.endpoints[i], exc_info=True)
        finally:
            current = asyncio.current_task()
            if current is not None:
                self._retired.discard(current)

    async def close(self) -> None:
        """Close every client (calls in flight on them are cancelled)."""
        for task in list(self._retired):
            task.cancel()
        for i, client in enumerate(self._clients):
            self._clients[i] = None
            if client is not None:
                with contextlib.suppress(Exception):
                    await wait_within(client.close(), self.timeout_s)

    # -- keys ---------------------------------------------------------------------------------------
    async def read_prefix(self, prefix: bytes) -> tuple[int, list[KeyValue]]:
        """Every key under ``prefix`` in one linearizable read: (the store's revision, keys)."""

        async def read(client: aetcd.Client) -> tuple[int, list[KeyValue]]:
            found = await client.get_prefix(prefix)
            return found.header.revision, [
                KeyValue(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease) for kv in found
            ]

        return await self._call("read", read)

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> None:
        """Set ``key`` (on ``lease`` when non-zero: deleted when the lease ends)."""
        await self._call("put", lambda c: c.put(key, value, lease=lease or None))

    async def transaction(
        self, compare: Sequence[Any], success: Sequence[Any], failure: Sequence[Any] = ()
    ) -> bool:
        """Apply ``success`` when every comparison holds, else ``failure``; True when it held.
        Raises EtcdOutcomeUnknownError when it got no answer (it may or may not have been
        applied: the caller reads the state back), EtcdUnavailableError otherwise."""
        succeeded, _ = await self._call(
            "transaction",
            lambda c: c.transaction(list(compare), list(success), list(failure)),
            idempotent=False,
        )
        return bool(succeeded)

    # -- leases -------------------------------------------------------------------------------------
    async def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its id."""
        lease = await self._call("lease grant", lambda c: c.lease(ttl_s))
        return int(lease.id)

    async def keep_alive(self, lease_id: int) -> int:
        """Renew ``lease_id`` once: its TTL in seconds from now, 0 when it has already expired.
        Raises EtcdUnavailableError (also when the stream ended without a reply)."""
        reply = await self._call("lease keep-alive", lambda c: c.refresh_lease(lease_id))
        if reply is None:
            raise EtcdUnavailableError("etcd lease keep-alive: the stream ended without a reply")
        return int(reply.TTL)

    async def revoke(self, lease_id: int) -> None:
        """End ``lease_id`` now (its keys are deleted); one that already expired is fine."""
        try:
            await self._call("lease revoke", lambda c: c.revoke_lease(lease_id))
        except EtcdLeaseNotFoundError:
            log.debug("etcd: lease %x had already expired", lease_id)


def _raise_if_cancelling() -> None:
    """Raise CancelledError when the current task is being cancelled. Python 3.11's wait_for
    hands back the inner call's result (or its error: a gRPC CANCELLED, an unreachable
    endpoint) when the cancellation meets a call that just finished, and the caller's loop
    would go on as if it had not been cancelled."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
