"""CommitLogServicer: mqstore.v1.CommitLogService over a LocalCommitLog (a thin translation:
parse, call the port, build the reply; errors are mapped by the server's error mapping)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from libstore import BrokerRole, InvalidArgumentError, TopicNotFoundError
from services._common import convert, wire
from services.commitlog.ha import HAController
from services.commitlog.local import MAX_TAIL_LINGER_MS, LocalCommitLog
from services.proto import commitlog_grpc, commitlog_pb, common_pb

SERVICE_NAME = commitlog_pb.DESCRIPTOR.services_by_name["CommitLogService"].full_name
MAX_RELEASE_KEEP = 65_536  # offsets a ReleaseTransient may keep (the dispatch service names <= 4,096)


class CommitLogServicer(commitlog_grpc.CommitLogServiceServicer):
    def __init__(self, port: LocalCommitLog, ha: HAController) -> None:
        self.port = port
        self.ha = ha

    async def Append(self, request: commitlog_pb.AppendRequest, context: grpc.aio.ServicerContext) -> bytes:
        """An AppendResponse, encoded here (convert.encode_results_reply)."""
        if request.records:
            if request.messages:
                raise InvalidArgumentError("send messages or records, not both")
            born = request.born_host or convert.peer_text(context.peer())
            results = await self.port.append_records(request.records, born)
            return convert.encode_results_reply(results)
        messages = request.messages
        if any(not m.born_host for m in messages):
            host = convert.peer_text(context.peer())
            for m in messages:
                if not m.born_host:
                    m.born_host = host
        # Encoded as they are (see RecordEncoder).
        results = await self.port.append(messages, expected_epoch=request.expected_epoch)
        return convert.encode_results_reply(results)

    async def Read(self, request: commitlog_pb.ReadRequest, context: grpc.aio.ServicerContext) -> bytes:
        """A ReadResponse, encoded here (services._common.wire): its records are copied once,
        from the log into the reply, and a gateway can pass them on in the same form."""
        if len(request.offsets) != len(request.sizes):
            raise InvalidArgumentError("offsets and sizes must have the same length")
        ranges = list(zip(request.offsets, request.sizes, strict=True))
        # maxReadRangesPerCall, maxReadBytesPerCall
        return await self.port.read_framed(ranges, wire.READ_RECORDS_TAG, bounded=True)

    async def Tail(
        self, request: commitlog_pb.TailRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[commitlog_pb.TailChunk]:
        if request.from_offset < 0 or request.max_chunk_bytes < 0 or request.heartbeat_ms < 0:
            raise InvalidArgumentError("from_offset, max_chunk_bytes and heartbeat_ms must be >= 0")
        if not 0 <= request.linger_ms <= MAX_TAIL_LINGER_MS:
            raise InvalidArgumentError(
                f"linger_ms must be within 0..{MAX_TAIL_LINGER_MS}, got {request.linger_ms}"
            )
        mapped_file_size = self.port.log.config.mapped_file_size_commit_log
        async for chunk in self.port.tail(
            request.from_offset,
            max_chunk_bytes=request.max_chunk_bytes,
            heartbeat_ms=request.heartbeat_ms,
            log_id=request.log_id,
            generation=request.generation,
            linger_ms=request.linger_ms,
        ):
            yield commitlog_pb.TailChunk(
                offset=chunk.offset,
                data=chunk.data,
                next_offset=chunk.next_offset,
                confirm_offset=chunk.confirm_offset,
                min_offset=chunk.min_offset,
                mapped_file_size=mapped_file_size,
                log_id=chunk.log_id,
                generation=chunk.generation,
            )

    async def GetMaxOffset(
        self, request: commitlog_pb.GetMaxOffsetRequest, context: grpc.aio.ServicerContext
    ) -> commitlog_pb.LogOffsets:
        o = await self.port.offsets()
        return commitlog_pb.LogOffsets(
            min_offset=o.min_offset,
            max_offset=o.max_offset,
            confirm_offset=o.confirm_offset,
            flushed_offset=o.flushed_offset,
            flush_disk_type=o.flush_disk_type,
            broker_role=o.broker_role,
            mapped_file_size=o.mapped_file_size,
            disk_free_bytes=o.disk_free_bytes,
            disk_total_bytes=o.disk_total_bytes,
            log_id=o.log_id,
            generation=o.generation,
            epoch=o.epoch,
            broker_name=o.broker_name,
            broker_id=o.broker_id,
            quarantine_dir=o.quarantine_dir,
            quarantined_files=o.quarantined_files,
            quarantined_bytes=o.quarantined_bytes,
            epoch_start=o.epoch_start,
            disk_used_ratio=o.disk_used_ratio,
            disk_full=o.disk_full,
            last_cleanup_ms=o.last_cleanup_ms,
            cleanup_deleted_files=o.cleanup_deleted_files,
            cleanup_deleted_bytes=o.cleanup_deleted_bytes,
        )

    async def UpsertTopic(
        self, request: commitlog_pb.UpsertTopicRequest, context: grpc.aio.ServicerContext
    ) -> common_pb.TopicConfig:
        config = convert.topic_from_pb(request.config, self.port.log.config.default_topic_queue_nums)
        return convert.topic_to_pb(await self.port.upsert_topic(config))

    async def GetTopic(
        self, request: commitlog_pb.GetTopicRequest, context: grpc.aio.ServicerContext
    ) -> common_pb.TopicConfig:
        config = await self.port.get_topic(request.topic, create=request.create_if_missing)
        if config is None:
            raise TopicNotFoundError(f"topic {request.topic!r} does not exist")
        return convert.topic_to_pb(config)

    async def ListTopics(
        self, request: commitlog_pb.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> commitlog_pb.ListTopicsResponse:
        return commitlog_pb.ListTopicsResponse(
            topics=[convert.topic_to_pb(t) for t in await self.port.list_topics()],
            tombstones=await self.port.topic_tombstones(),
        )

    async def DeleteTopic(
        self, request: commitlog_pb.DeleteTopicRequest, context: grpc.aio.ServicerContext
    ) -> commitlog_pb.DeleteTopicResponse:
        return commitlog_pb.DeleteTopicResponse(deleted=await self.port.delete_topic(request.topic))

    async def ReleaseTransient(
        self, request: commitlog_pb.ReleaseTransientRequest, context: grpc.aio.ServicerContext
    ) -> commitlog_pb.ReleaseTransientResponse:
        if request.below < 0:
            raise InvalidArgumentError(f"release below a negative offset: {request.below}")
        if len(request.keep) > MAX_RELEASE_KEEP:
            raise InvalidArgumentError(f"{len(request.keep)} offsets to keep; at most {MAX_RELEASE_KEEP}")
        released = await self.port.release_transient(
            request.below, request.log_id, request.generation, request.keep
        )
        return commitlog_pb.ReleaseTransientResponse(released=released)

    async def GetHAState(
        self, request: commitlog_pb.GetHAStateRequest, context: grpc.aio.ServicerContext
    ) -> commitlog_pb.HAState:
        return self.ha.state()

    async def Promote(
        self, request: commitlog_pb.PromoteRequest, context: grpc.aio.ServicerContext
    ) -> commitlog_pb.HAState:
        role = _role(request.broker_role) if request.broker_role else None
        return await self.ha.promote(role, force=request.force)

    async def Demote(
        self, request: commitlog_pb.DemoteRequest, context: grpc.aio.ServicerContext
    ) -> commitlog_pb.HAState:
        if request.min_epoch < 0:
            raise InvalidArgumentError("min_epoch must be >= 0")
        return await self.ha.demote(request.master_address, request.min_epoch)


def _role(text: str) -> BrokerRole:
    try:
        return BrokerRole(text.strip().upper())
    except ValueError:
        raise InvalidArgumentError(f"broker_role must be ASYNC_MASTER or SYNC_MASTER, got {text!r}") from None


def add_to_server(servicer: CommitLogServicer, server: grpc.aio.Server) -> list[str]:
    commitlog_grpc.add_CommitLogServiceServicer_to_server(servicer, server)
    return [SERVICE_NAME]
