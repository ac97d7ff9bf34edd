"""HandleRenewer: keeps a PushConsumer's messages invisible while its listener works on them.

A PushConsumer receives with ``auto_renew`` and no invisible duration (spec sheet
rocketmq-grpc-v2 §4): RocketMQ's proxy then hides each message for ``defaultInvisibleTimeMills``
(60 s) and, while the client is connected, renews the invisible time shortly before it runs out
(``renewAheadTimeMillis`` ahead, by the same slice each time, for at most ``renewMaxTimeMillis``,
3 h), until the client acks or nacks. The client keeps acking with the handle it received, so the
renewer maps that original handle to the latest one (each ChangeInvisibleTime returns a new
handle).

This is connection state, like the Telemetry sessions: it lives in the gateway that served the
receive. When that gateway restarts, renewal stops and the client's later ack with an old handle
is refused (INVALID_RECEIPT_HANDLE); the message then comes back after its invisible time, as
at-least-once delivery allows. Renewal also stops for a client without an open Telemetry stream.

A client that goes away holding deliveries (it sends NotifyClientTermination, or its last
Telemetry stream closes) has them released (:meth:`HandleRenewer.release_client`): made visible
again ``invisibleTimeMillisWhenClear`` (1 s) later, as RocketMQ's proxy clears a departed
client's handles, instead of staying hidden for the rest of their 60 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from services.ports import DispatchPort

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Held:
    client_id: str
    group: str
    topic: str
    handle: str  # the latest receipt handle
    visible_at: int  # ms since the epoch
    since: int  # first delivery, ms
    renewing: asyncio.Future[None] | None = None  # set while a renewal is in flight


class HandleRenewer:
    """Renews tracked deliveries through ``dispatch``; ``connected(client_id)`` says whether the
    client still has a stream open. Times in ms."""

    def __init__(
        self,
        dispatch: DispatchPort,
        connected: Callable[[str], bool],
        *,
        slice_ms: int = 60_000,
        ahead_ms: int = 10_000,
        max_ms: int = 3 * 3600 * 1000,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.dispatch = dispatch
        self.connected = connected
        self.slice_ms = slice_ms
        self.ahead_ms = ahead_ms
        self.max_ms = max_ms
        self.clock = clock
        self._held: dict[str, _Held] = {}  # original handle -> state
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._held)

    @property
    def period_s(self) -> float:
        """How often renewals are looked for: often enough to act ``ahead_ms`` before expiry."""
        return max(0.05, min(5.0, self.ahead_ms / 2000.0))

    def track(self, client_id: str, group: str, topic: str, handle: str, visible_at: int) -> None:
        self._held[handle] = _Held(client_id, group, topic, handle, visible_at, self.clock())
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    @contextlib.asynccontextmanager
    async def settling(self, handles: Sequence[str]) -> AsyncIterator[list[str]]:
        """For an ack, nack or dead-lettering of the deliveries first handed out as ``handles``:
        stop renewing them (a renewal racing the call would supersede the handle it uses) and
        yield their latest handles, after any renewal in flight. When the block raises (the
        store was unreachable), they are renewed again."""
        taken: list[tuple[str, _Held | None]] = []
        for handle in handles:
            held = self._held.get(handle)
            while held is not None and held.renewing is not None:
                await asyncio.shield(held.renewing)
            taken.append((handle, self._held.pop(handle, None)))
        try:
            yield [held.handle if held else handle for handle, held in taken]
        except BaseException:
            for handle, held in taken:
                if held is not None:
                    self._held.setdefault(handle, held)
            raise

    async def release_client(self, client_id: str, invisible_ms: int) -> int:
        """Stop renewing the deliveries of ``client_id`` and make each visible again in
        ``invisible_ms``; returns how many were released (one that fails, e.g. acked meanwhile,
        is left to its invisible time)."""
        released = 0
        for original in [h for h, held in self._held.items() if held.client_id == client_id]:
            held = self._held.get(original)
            while held is not None and held.renewing is not None:
                await asyncio.shield(held.renewing)
            held = self._held.pop(original, None)
            if held is None:
                continue  # settled meanwhile
            try:
                await self.dispatch.change_invisible(held.group, held.topic, held.handle, invisible_ms)
                released += 1
            except Exception as exc:
                log.debug("releasing %s failed: %s", original, exc)
        if released:
            log.info("released %d deliveries of client %s, which went away", released, client_id)
        return released

    async def give_back(self, group: str, topic: str, handles: Sequence[str], invisible_ms: int) -> int:
        """Deliveries first handed out as ``handles`` that never reached their receiver (its
        receive was cancelled while they were being written): stop renewing them and make each
        visible again in ``invisible_ms``; returns how many were (one acked or dead-lettered
        meanwhile is left alone)."""
        given = 0
        async with self.settling(handles) as current:
            for handle in current:
                try:
                    await self.dispatch.change_invisible(group, topic, handle, invisible_ms)
                    given += 1
                except Exception as exc:
                    log.debug("giving back %s failed: %s", handle, exc)
        return given

    async def renew_due(self) -> int:
        """Renew every delivery that becomes visible within ``ahead_ms``; returns how many."""
        now = self.clock()
        renewed = 0
        for original, held in list(self._held.items()):
            if self._held.get(original) is not held or held.visible_at - now > self.ahead_ms:
                continue  # taken for an ack meanwhile, or not due
            if not self.connected(held.client_id) or now - held.since >= self.max_ms:
                self._held.pop(original, None)  # left to come back when its time runs out
                continue
            held.renewing = asyncio.get_running_loop().create_future()
            try:
                new = await self.dispatch.change_invisible(held.group, held.topic, held.handle, self.slice_ms)
                held.handle, held.visible_at = new, self.clock() + self.slice_ms
                renewed += 1
            except Exception as exc:  # expired, or dispatch unreachable: retried next round
                log.debug("renewing %s failed: %s", original, exc)
                if held.visible_at <= self.clock():
                    self._held.pop(original, None)
            finally:
                held.renewing.set_result(None)
                held.renewing = None
        return renewed

    async def _run(self) -> None:
        while self._held:
            await asyncio.sleep(self.period_s)
            try:
                await self.renew_due()
            except Exception:
                log.exception("receipt handle renewal failed")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
