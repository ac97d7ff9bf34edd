"""Queue runs: a dispatched chunk's records grouped by the queue they go to.

Dispatch hands each CommitLogDispatcher consecutive records in log order (libstore.dispatch).
The ConsumeQueues write one run of units per queue (ConsumeQueue.put_packed), the transient
release notes each queue's last stub, and the follower reports each queue's new max offset to
the held pulls; all need the records grouped by queue, and apply_chunk groups a chunk once for
all of them. :func:`queue_runs` does that grouping, in C when libstore._codec is
built (one pass, no Python per record: the per-record loop cost ~1.7 µs a record in the
ConsumeQueues and ~0.3 in the arrivals), else in Python, the reference the tests hold the C
code to.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from libstore import record_codec
from libstore.dispatch_request import DispatchRequest
from libstore.message import MessageSysFlag

_UNIT = struct.Struct(">qiq")  # a ConsumeQueue unit: CommitLog offset, size, tags code
# PREPARED (0x4) and ROLLBACK (0xC) records take no queue offset, hence no unit.
_NO_QUEUE_OFFSET = MessageSysFlag.TRANSACTION_PREPARED_TYPE
_STUB = MessageSysFlag.TRANSIENT_STUB_FLAG


# One queue's records in a chunk, in log order: (topic, queue id, first, last, first_end,
# last_end, units, members, last_stub). ``first`` and ``last``: their first and last queue
# offsets. With units asked for: ``first_end`` and ``last_end`` are the CommitLog offsets where
# the first and the last record end, and ``units`` their ConsumeQueue units, packed (20 bytes
# each, big-endian), when their queue offsets are consecutive (None otherwise: a hole or a
# replay, written record by record). Without: 0, 0 and None. ``last_stub``: the queue offset of
# the last (in log order) transient message's stub among them, -1 for none (libstore.durability;
# what the transient release notes). A plain tuple: a chunk makes one per queue, unpacked at once.
QueueRun = tuple[str, int, int, int, int, int, bytes | None, list[DispatchRequest], int]


def queue_runs(requests: Sequence[DispatchRequest], *, with_units: bool = True) -> list[QueueRun]:
    """The runs of ``requests`` (records in log order) that take a queue offset (not PREPARED
    or ROLLBACK), one per queue, in the order the queues first appear. In C when built."""
    ext = record_codec.native()
    if ext is not None:
        found = ext.queue_runs(requests if type(requests) is list else list(requests), with_units)
        if found is not NotImplemented:
            return found  # type: ignore[no-any-return]
    return _queue_runs_py(requests, with_units)


def _queue_runs_py(requests: Sequence[DispatchRequest], with_units: bool) -> list[QueueRun]:
    members_of: dict[tuple[str, int], list[DispatchRequest]] = {}
    for req in requests:
        if req.sys_flag & _NO_QUEUE_OFFSET:
            continue
        key = (req.topic, req.queue_id)
        members = members_of.get(key)
        if members is None:
            members_of[key] = [req]
        else:
            members.append(req)
    out: list[QueueRun] = []
    for (topic, queue_id), members in members_of.items():
        head, tail = members[0], members[-1]
        first = head.consume_queue_offset
        consecutive = all(r.consume_queue_offset == first + k for k, r in enumerate(members))
        last_stub = next((r.consume_queue_offset for r in reversed(members) if r.sys_flag & _STUB), -1)
        units = None
        first_end = last_end = 0
        if with_units:
            first_end = head.commit_log_offset + head.msg_size
            last_end = tail.commit_log_offset + tail.msg_size
            if consecutive:
                units = b"".join(_UNIT.pack(r.commit_log_offset, r.msg_size, r.tags_code) for r in members)
        last = tail.consume_queue_offset
        out.append((topic, queue_id, first, last, first_end, last_end, units, members, last_stub))
    return out
