"""A pull's reply read on the client: each queue's position and its records, decoded in place.

The gateway's PullManyResponse (protos/mqstore/v1/gateway.proto) carries each queue's records as
``repeated bytes records``. Read through the protobuf runtime, a reply of up to 4 MiB is copied
into the message, then each record into a bytes object of its own, and then decoded (its body
copied once more): in a consumer's profile (16 queues, 1 KiB messages) the first two copies and
the parse took about a seventh of its CPU. With the C module (libstore/_codec.c:
``pull_many_results``, ``pull_result_records``) the reply's bytes are read where they lie: a
walk of its fields gives each result's queue id, next offset, skipped count and where it lies,
and its records are decoded from there when asked for (PullConsumer asks after it has moved
its positions and, with no other pull in flight, sent its next pull). Whatever the C code
leaves alone (a field with an unexpected wire type, the non-raw form, a record it does not
decode) goes through the protobuf runtime instead, which reads the
same reply the same way and words the errors (``tests/unit/services/test_pull_reply.py``
compares the two on generated replies).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from libstore.message import MessageRecord
from libstore.record_codec import decode_records, native
from services.proto import gateway_pb


@dataclass(slots=True)
class PulledQueue:
    """One queue's result of a pull: ``queue_id``, ``next_offset`` (where to pull next),
    ``skipped`` (messages passed over because retention deleted them), ``has_records``; and
    :meth:`records`, decoded when called (raises CorruptRecordError for a damaged one). The
    records come from ``response`` (a PullResponse message) or, when that is None, from the
    serialized result at ``raw[start:end]``."""

    queue_id: int
    next_offset: int
    skipped: int
    has_records: bool
    response: Any = field(default=None, repr=False)
    raw: bytes = field(default=b"", repr=False)
    start: int = 0
    end: int = 0

    @classmethod
    def of(cls, response: Any, queue_id: int | None = None) -> PulledQueue:
        """From a PullResponse message: one result of a PullMany's reply, or (``queue_id``
        given: a Pull's reply does not name its queue) a Pull's reply."""
        return cls(
            response.queue_id if queue_id is None else queue_id,
            response.next_offset,
            response.skipped,
            bool(response.records),
            response=response,
        )

    def records(self) -> list[MessageRecord]:
        """The result's records, decoded (list of MessageRecord, in queue order)."""
        if not self.has_records:
            return []
        response = self.response
        if response is None:
            ext = native()
            got = ext.pull_result_records(self.raw, self.start, self.end, True) if ext else NotImplemented
            if got is not NotImplemented:
                return got
            response = gateway_pb.PullResponse.FromString(self.raw[self.start : self.end])
        return decode_records(list(response.records))


def pull_many_results(raw: bytes) -> list[PulledQueue]:
    """The results of a serialized PullManyResponse (bytes), in the reply's order. Raises
    google.protobuf.message.DecodeError for bytes that are not one."""
    ext = native()
    heads = ext.pull_many_results(raw) if ext is not None else NotImplemented
    if heads is NotImplemented:
        return [PulledQueue.of(result) for result in gateway_pb.PullManyResponse.FromString(raw).results]
    return [
        PulledQueue(queue_id, next_offset, skipped, count > 0, raw=raw, start=start, end=end)
        for queue_id, next_offset, skipped, count, start, end in heads
    ]
