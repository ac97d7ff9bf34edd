"""Concurrent message-form appends to a remote CommitLog, sent together as one Append call.

In the split topology each RocketMQ 5 SendMessage (the official clients send one message per
call) was one Append call from the gateway to the commitlog service, and one tail chunk from
the commitlog service to each follower (dispatch, index): about 1.4 ms of CPU over the three
processes for every message, where the embedded suite spends a function call. This is group
commit at the RPC:

* A **lane** is one topic and one expected epoch. A call whose lane has no Append of its own in
  flight is sent at once, from the caller's own task: one message at a time waits for nothing
  it did not wait for before.
* Calls that arrive while their lane's Append is in flight queue, and go together in the next
  Append when it returns, in arrival order: up to :data:`MAX_MESSAGES` messages and
  :data:`MAX_BYTES` of serialized messages a call (a caller's own messages are never split
  across calls, and a caller over the bounds alone goes alone).
* Each caller gets the results of its own messages (:meth:`PutMessageResults.part`). A wait
  for the store (SYNC_FLUSH, SYNC_MASTER) is the call's: when it times out, every caller of the
  call reads the timeout status, as messages of one batch do.
* A message whose UNIQ_KEY is already in the call being built (a client sending again while the
  first is still queued) waits for the next call, so the commitlog's de-duplication window
  still answers the second with the first one's result.

What stays as it was for every caller:

* **Refusals.** The commitlog refuses a batch whole when one message in it is bad (the encoder
  names the first and writes none). A coalesced call refused that way (MessageIllegalError,
  InvalidArgumentError, TopicNotFoundError, PermissionDeniedError, TooManyRequestsError: all
  raised before anything is written) is sent again as one call per caller, so only the caller
  whose message is bad sees the refusal. Any other failure (the commitlog unavailable, the
  deadline passed) reaches every caller of the call, as it would have reached each alone.
* **Waits.** A lane is one topic, so messages that share a call share their durability: a
  transient topic's are never held back by a persistent topic's flush. A call with a message
  that sets WAIT (to anything but a value that waits) or DURABILITY goes alone, never
  coalesced: its own condition decides when it is answered, as before.
* **Cancellation.** A caller cancelled before its call is sent is never sent; one cancelled
  while its coalesced call is in flight stops waiting, and the call goes on for the others
  (the append may or may not happen, as when an Append is cancelled mid-flight; nor is it sent
  again if the call is refused). A caller sending at once is its call: cancelling it cancels
  that Append. A queued caller waits for the call in flight, then its own: up to twice the
  per-call deadline.

Used from one event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from libstore import PutMessageResults
from libstore.errors import MessageIllegalError, PermissionDeniedError, StoreError, TopicNotFoundError
from libstore.message import MessageConst, waits_for_store
from libstore.scheduled_message import SCHEDULING_PROPERTIES
from services.proto import common_pb

MAX_MESSAGES = 1024  # maxMessagesPerRequest's default: what one Append may carry
MAX_BYTES = 4 * 1024 * 1024  # serialized messages a coalesced call carries at most

# Raised by the commitlog for a message of the call before it writes anything of it (the
# encoder's refusals). Push back (SYSTEM_BUSY) is not one: it would be for each caller alone too.
REFUSED_WHOLE = (MessageIllegalError, TopicNotFoundError, PermissionDeniedError)

Send = Callable[[list[common_pb.Message], int], Awaitable[PutMessageResults]]


@dataclass(slots=True)
class _Waiting:
    messages: list[common_pb.Message]
    size: int
    answer: asyncio.Future[PutMessageResults]


@dataclass(slots=True)
class _Lane:
    queue: collections.deque[_Waiting] = field(default_factory=collections.deque)
    busy: bool = False


def lane_of(messages: Sequence[common_pb.Message], expected_epoch: int) -> tuple[str, int] | None:
    """The lane ``messages`` may share an Append in: (topic, expected epoch); None when they
    must go alone: several topics, or a message that sets WAIT to a value that does not wait,
    DURABILITY, or a delivery time (DELAY, TIMER_*: the commitlog moves it to the timer topic,
    which is persistent, so it would make a transient topic's call wait for the store)."""
    topic = messages[0].topic
    for m in messages:
        if m.topic != topic:
            return None
        props = m.properties
        if props and (
            MessageConst.DURABILITY in props
            or (MessageConst.WAIT in props and not waits_for_store(props[MessageConst.WAIT]))
            or not SCHEDULING_PROPERTIES.isdisjoint(props)
        ):
            return None
    return topic, expected_epoch


class AppendCoalescer:
    """Sends message-form appends through ``send(messages, expected_epoch)`` (one Append call),
    those that arrive while their lane's call is in flight together (module docstring)."""

    def __init__(self, send: Send, *, max_messages: int = MAX_MESSAGES, max_bytes: int = MAX_BYTES) -> None:
        if max_messages <= 0 or max_bytes <= 0:
            raise ValueError("coalescing bounds must be positive")
        self._send = send
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0  # Append calls sent
        self.coalesced = 0  # of them, calls that carried more than one caller's messages

    async def append(self, messages: list[common_pb.Message], expected_epoch: int = 0) -> PutMessageResults:
        """The results of ``messages`` (a non-empty list), appended in one Append call, maybe
        with other callers' messages of the same lane. Raises what the call raised (StoreError
        classes), the refusals of a coalesced call only to the caller they concern."""
        key = lane_of(messages, expected_epoch)
        if key is None:
            self.calls += 1
            return await self._send(messages, expected_epoch)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        if not lane.busy:
            lane.busy = True
            try:
                self.calls += 1
                return await self._send(messages, expected_epoch)
            finally:
                self._next(key, lane)
        waiting = _Waiting(
            messages, sum(m.ByteSize() for m in messages), asyncio.get_running_loop().create_future()
        )
        lane.queue.append(waiting)
        try:
            return await waiting.answer
        except asyncio.CancelledError:
            # Not sent yet: nothing of it will be. In a call in flight: it goes on for the others.
            with contextlib.suppress(ValueError):
                lane.queue.remove(waiting)
            raise

    def _next(self, key: tuple[str, int], lane: _Lane) -> None:
        """The lane's call returned: send what queued meanwhile, or free the lane."""
        loop = asyncio.get_running_loop()  # before anything leaves the queue
        batch: list[_Waiting] = []
        count = size = 0
        keys: set[str] = set()  # UNIQ_KEYs in the batch
        queue = lane.queue
        while queue:
            head = queue[0]
            if head.answer.done():  # cancelled: nothing of it is sent
                queue.popleft()
                continue
            n = len(head.messages)
            if batch and (count + n > self.max_messages or size + head.size > self.max_bytes):
                break
            # A message sent again (same UNIQ_KEY) while the first is queued goes in a later
            # call: the commitlog's de-duplication window answers it with the first one's result
            # then, where in one call both would be written.
            mine = [k for m in head.messages if (k := m.properties.get(MessageConst.UNIQ_KEY))]
            if batch and not keys.isdisjoint(mine):
                break
            keys.update(mine)
            batch.append(queue.popleft())
            count += n
            size += head.size
        if not batch:
            lane.busy = False
            del self._lanes[key]
            return
        task = loop.create_task(self._run(key, lane, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, key: tuple[str, int], lane: _Lane, batch: list[_Waiting]) -> None:
        epoch = key[1]
        try:
            batch = [w for w in batch if not w.answer.done()]  # cancelled since: not sent
            if len(batch) == 1:
                self.calls += 1
                await _answer(batch[0], self._send(batch[0].messages, epoch))
            elif batch:
                await self._run_together(batch, epoch)
        finally:
            for w in batch:  # whatever went wrong above, nobody is left waiting
                _settle(w, StoreError("the coalesced append ended without an answer"))
            self._next(key, lane)

    async def _run_together(self, batch: list[_Waiting], epoch: int) -> None:
        self.calls += 1
        self.coalesced += 1
        messages = [m for w in batch for m in w.messages]
        try:
            results = await self._send(messages, epoch)
        except REFUSED_WHOLE:
            # Nothing was written: each caller's messages alone (those still waiting), so a bad
            # message fails only its own caller.
            again = [w for w in batch if not w.answer.done()]
            self.calls += len(again)
            await asyncio.gather(*(_answer(w, self._send(w.messages, epoch)) for w in again))
            return
        except asyncio.CancelledError:  # the loop is stopping
            for w in batch:
                w.answer.cancel()
            raise
        except Exception as exc:
            for w in batch:
                _settle(w, exc)
            return
        if len(results) != len(messages):
            for w in batch:
                _settle(w, StoreError(f"{len(results)} results for an Append of {len(messages)} messages"))
            return
        start = 0
        for w in batch:
            stop = start + len(w.messages)
            if not w.answer.done():
                w.answer.set_result(results.part(start, stop))
            start = stop


async def _answer(waiting: _Waiting, call: Awaitable[PutMessageResults]) -> None:
    """Settle ``waiting`` with what ``call`` returns or raises (a caller cancelled meanwhile
    has no one to answer)."""
    try:
        results = await call
    except asyncio.CancelledError:
        waiting.answer.cancel()
        raise
    except Exception as exc:
        _settle(waiting, exc)
        return
    if not waiting.answer.done():
        waiting.answer.set_result(results)


def _settle(waiting: _Waiting, exc: Exception) -> None:
    if not waiting.answer.done():
        waiting.answer.set_exception(exc)
