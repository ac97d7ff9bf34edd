"""RemoteCommitLog: the CommitLogPort over the CommitLogService stub (split topology)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from libstore import PutMessageResults, TopicConfig, TopicNotFoundError
from libstore.message import MessageFields
from libstore.record_framing import retag
from services._common import convert, wire
from services._common.mux import MuxMethod, carried_stub, channel_mux
from services._common.remote import DEFAULT_TIMEOUT_S, call, reraise_mapped
from services.commitlog.append_coalescer import AppendCoalescer
from services.commitlog.read_plan import DEFAULT_RECORD_SIZE, plan_reads
from services.ports import LogOffsets, TailChunk
from services.proto import commitlog_grpc, commitlog_pb, common_pb

# Calls carried on one stream (services._common.mux): topic lookups, and appends and reads of
# at most CARRIED_MAX_BYTES (a pop journal's records, a single send, a pop's few records). A
# larger one goes unary, so no small call waits behind it on the stream.
CARRIED = ("Append", "Read", "GetTopic", "ReleaseTransient")
CARRIED_MAX_BYTES = 256 * 1024
READ_METHOD = "/mqstore.v1.CommitLogService/Read"


def _carried_read(sizes: Sequence[int]) -> bool:
    """Whether a Read of records of ``sizes`` (0: a whole record of unknown size) goes on the
    stream: at most CARRIED_MAX_BYTES."""
    return sum(sizes) + sizes.count(0) * DEFAULT_RECORD_SIZE <= CARRIED_MAX_BYTES


class RemoteCommitLog:
    """CommitLogPort over ``channel``; ``timeout_s`` bounds each call (retries included)."""

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.stub = commitlog_grpc.CommitLogServiceStub(channel)
        service = commitlog_pb.DESCRIPTOR.services_by_name["CommitLogService"]
        mux = channel_mux(channel)
        self.carried = carried_stub(self.stub, mux, service, CARRIED)
        # Read answered in its wire form (services._common.wire), unary or carried.
        self._read_encoded = channel.unary_unary(
            READ_METHOD, request_serializer=commitlog_pb.ReadRequest.SerializeToString
        )
        self._read_encoded_carried = MuxMethod(mux, self._read_encoded, READ_METHOD, bytes)
        self.timeout_s = timeout_s
        self.coalescer = AppendCoalescer(self._append_call)

    async def append(
        self, messages: Sequence[MessageFields], *, expected_epoch: int = 0
    ) -> PutMessageResults:
        """Appends that arrive while another of the same topic is in flight go in one Append
        call with the others (services.commitlog.append_coalescer)."""
        pbs = [m if isinstance(m, common_pb.Message) else convert.message_to_pb(m) for m in messages]
        if not pbs:
            return await self._append_call(pbs, expected_epoch)
        return await self.coalescer.append(pbs, expected_epoch)

    async def _append_call(self, messages: list[common_pb.Message], expected_epoch: int) -> PutMessageResults:
        request = commitlog_pb.AppendRequest(messages=messages, expected_epoch=expected_epoch)
        # Sized by the bodies (ByteSize would encode the request once more just to count it).
        method = self._append_method(sum(len(m.body) for m in messages))
        reply = await call(method, request, idempotent=False, timeout_s=self.timeout_s)
        return convert.results_from_pb(reply.results)

    async def append_records(self, raw: bytes, born_host: str = "") -> PutMessageResults:
        request = commitlog_pb.AppendRequest(records=raw, born_host=born_host)
        reply = await call(self._append_method(len(raw)), request, idempotent=False, timeout_s=self.timeout_s)
        return convert.results_from_pb(reply.results)

    def _append_method(self, size: int) -> Any:
        """The Append of a request of about ``size`` bytes: carried up to CARRIED_MAX_BYTES."""
        return self.carried.Append if size <= CARRIED_MAX_BYTES else self.stub.Append

    async def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        """The records at ``ranges``, in as many Read calls as the service's per-call bounds
        need (services.commitlog.read_plan), sent together."""
        out: list[bytes | None] = []
        for reply in await self._planned_reads(ranges, self.carried.Read, self.stub.Read):
            out += convert.records_or_none(reply.records)
        return out

    async def read_framed(self, ranges: Sequence[tuple[int, int]], tag: int) -> bytearray:
        """The records at ``ranges`` framed with ``tag``: the Read replies' wire form as the
        service encoded it (services._common.wire), re-tagged in place, no record decoded."""
        replies = await self._planned_reads(ranges, self._read_encoded_carried, self._read_encoded)
        framed = bytearray().join(replies)
        if tag != wire.READ_RECORDS_TAG:
            retag(framed, tag)
        return framed

    async def _planned_reads(self, ranges: Sequence[tuple[int, int]], carried: Any, unary: Any) -> list[Any]:
        """The replies of the Read calls ``ranges`` are cut into (read_plan), in order: each
        through ``carried`` when small enough for the call stream, else ``unary``."""

        async def one(chunk: Sequence[tuple[int, int]]) -> Any:
            offsets, sizes = convert.ranges_to_columns(chunk)
            return await call(
                carried if _carried_read(sizes) else unary,
                commitlog_pb.ReadRequest(offsets=offsets, sizes=sizes),
                idempotent=True,
                timeout_s=self.timeout_s,
            )

        chunks = plan_reads(ranges)
        if len(chunks) == 1:
            return [await one(chunks[0])]
        return list(await asyncio.gather(*map(one, chunks)))

    async def tail(
        self,
        from_offset: int,
        *,
        max_chunk_bytes: int = 0,
        heartbeat_ms: int = 0,
        decoded: bool = False,
        log_id: str = "",
        generation: int = 0,
        linger_ms: int = 0,
    ) -> AsyncIterator[TailChunk]:
        """The Tail stream (always bytes: ``decoded`` is for in-process ports); ends with the
        mapped StoreError (LogDivergedError included, or grpc.RpcError) when it breaks: the
        caller reconnects from its own reput offset."""
        request = commitlog_pb.TailRequest(
            from_offset=from_offset,
            max_chunk_bytes=max_chunk_bytes,
            heartbeat_ms=heartbeat_ms,
            log_id=log_id,
            generation=generation,
            linger_ms=linger_ms,
        )
        stream = self.stub.Tail(request)
        try:
            async for chunk in stream:
                yield TailChunk(
                    chunk.offset,
                    chunk.data,
                    chunk.next_offset,
                    chunk.confirm_offset,
                    chunk.min_offset,
                    None,
                    chunk.log_id,
                    chunk.generation,
                )
        except grpc.RpcError as err:
            reraise_mapped(err)
        finally:
            stream.cancel()

    async def offsets(self) -> LogOffsets:
        o = await call(
            self.stub.GetMaxOffset,
            commitlog_pb.GetMaxOffsetRequest(),
            idempotent=True,
            timeout_s=self.timeout_s,
        )
        return LogOffsets(
            o.min_offset,
            o.max_offset,
            o.confirm_offset,
            o.flushed_offset,
            o.flush_disk_type,
            o.broker_role,
            o.mapped_file_size,
            o.disk_free_bytes,
            o.disk_total_bytes,
            o.log_id,
            o.generation,
            o.epoch,
            o.broker_name,
            o.broker_id,
            o.quarantine_dir,
            o.quarantined_files,
            o.quarantined_bytes,
            o.epoch_start,
            o.disk_used_ratio,
            o.disk_full,
            o.last_cleanup_ms,
            o.cleanup_deleted_files,
            o.cleanup_deleted_bytes,
        )

    async def upsert_topic(self, config: TopicConfig) -> TopicConfig:
        reply = await call(
            self.stub.UpsertTopic,
            commitlog_pb.UpsertTopicRequest(config=convert.topic_to_pb(config)),
            idempotent=True,
            timeout_s=self.timeout_s,
        )
        return convert.topic_from_pb(reply)

    async def get_topic(self, topic: str, *, create: bool = False) -> TopicConfig | None:
        try:
            reply = await call(
                self.carried.GetTopic,
                commitlog_pb.GetTopicRequest(topic=topic, create_if_missing=create),
                idempotent=True,
                timeout_s=self.timeout_s,
            )
        except TopicNotFoundError:
            if create:
                raise
            return None
        return convert.topic_from_pb(reply)

    async def list_topics(self) -> list[TopicConfig]:
        reply = await call(
            self.stub.ListTopics, commitlog_pb.ListTopicsRequest(), idempotent=True, timeout_s=self.timeout_s
        )
        return [convert.topic_from_pb(t) for t in reply.topics]

    async def topic_tombstones(self) -> dict[str, int]:
        reply = await call(
            self.stub.ListTopics, commitlog_pb.ListTopicsRequest(), idempotent=True, timeout_s=self.timeout_s
        )
        return dict(reply.tombstones)

    async def delete_topic(self, topic: str) -> bool:
        reply = await call(
            self.stub.DeleteTopic,
            commitlog_pb.DeleteTopicRequest(topic=topic),
            idempotent=True,
            timeout_s=self.timeout_s,
        )
        return reply.deleted

    async def release_transient(
        self, below: int, log_id: str = "", generation: int = 0, keep: Sequence[int] = ()
    ) -> int:
        reply = await call(
            self.carried.ReleaseTransient,
            commitlog_pb.ReleaseTransientRequest(
                below=below, log_id=log_id, generation=generation, keep=keep
            ),
            idempotent=True,
            timeout_s=self.timeout_s,
        )
        return int(reply.released)

    # -- HA administration (not part of CommitLogPort) ------------------------------------------------
    async def ha_state(self) -> commitlog_pb.HAState:
        return await call(
            self.stub.GetHAState, commitlog_pb.GetHAStateRequest(), idempotent=True, timeout_s=self.timeout_s
        )

    async def promote(self, broker_role: str = "", force: bool = False) -> commitlog_pb.HAState:
        """Promote this SLAVE (RoleSwitchError when refused). Not retried: check the state after
        a failure."""
        return await call(
            self.stub.Promote,
            commitlog_pb.PromoteRequest(broker_role=broker_role, force=force),
            idempotent=False,
            timeout_s=self.timeout_s,
        )

    async def demote(self, master_address: str, min_epoch: int = 0) -> commitlog_pb.HAState:
        """Make this store a SLAVE of ``master_address`` (an HA endpoint)."""
        return await call(
            self.stub.Demote,
            commitlog_pb.DemoteRequest(master_address=master_address, min_epoch=min_epoch),
            idempotent=True,
            timeout_s=self.timeout_s,
        )
