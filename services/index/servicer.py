"""IndexServicer: mqstore.v1.IndexService over a LocalIndex (thin translation)."""

from __future__ import annotations

import grpc

from services.index.local import LocalIndex
from services.proto import index_grpc, index_pb

SERVICE_NAME = index_pb.DESCRIPTOR.services_by_name["IndexService"].full_name


class IndexServicer(index_grpc.IndexServiceServicer):
    def __init__(self, port: LocalIndex) -> None:
        self.port = port

    async def QueryByKey(
        self, request: index_pb.QueryByKeyRequest, context: grpc.aio.ServicerContext
    ) -> index_pb.QueryByKeyResponse:
        offsets = await self.port.query_by_key(
            request.topic, request.key, request.begin_ms, request.end_ms, request.max_count or 32
        )
        return index_pb.QueryByKeyResponse(phy_offsets=offsets)

    async def GetIndexStatus(
        self, request: index_pb.GetIndexStatusRequest, context: grpc.aio.ServicerContext
    ) -> index_pb.IndexStatus:
        s = await self.port.status()
        return index_pb.IndexStatus(
            reput_offset=s.reput_offset, confirm_offset=s.confirm_offset, index_files=s.files
        )


def add_to_server(servicer: IndexServicer, server: grpc.aio.Server) -> list[str]:
    index_grpc.add_IndexServiceServicer_to_server(servicer, server)
    return [SERVICE_NAME]
