"""RemoteIndex: the IndexPort over the IndexService stub (split topology)."""

from __future__ import annotations

import grpc

from services._common.remote import DEFAULT_TIMEOUT_S, call
from services.ports import DerivedStatus
from services.proto import index_grpc, index_pb


class RemoteIndex:
    def __init__(self, channel: grpc.aio.Channel, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.stub = index_grpc.IndexServiceStub(channel)
        self.timeout_s = timeout_s

    async def query_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int
    ) -> list[int]:
        request = index_pb.QueryByKeyRequest(
            topic=topic, key=key, begin_ms=begin_ms, end_ms=end_ms, max_count=max_count
        )
        r = await call(self.stub.QueryByKey, request, idempotent=True, timeout_s=self.timeout_s)
        return list(r.phy_offsets)

    async def status(self) -> DerivedStatus:
        r = await call(
            self.stub.GetIndexStatus,
            index_pb.GetIndexStatusRequest(),
            idempotent=True,
            timeout_s=self.timeout_s,
        )
        return DerivedStatus(r.reput_offset, r.confirm_offset, 0, r.index_files)
