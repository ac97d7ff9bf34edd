"""The generated apache.rocketmq.v2 modules (protos/apache/rocketmq/v2), imported in one place.

They register the ``apache.rocketmq.v2`` names in protobuf's default descriptor pool, as the
official client's own stubs do, so the two cannot be imported into one Python process: the
gateway serves the protocol, clients run elsewhere. Only the RocketMQ-protocol modules import
this one.
"""

from __future__ import annotations

import services.proto  # noqa: F401  (refuses stale or missing generated code)
from services.pb.apache.rocketmq.v2 import definition_pb2 as definition
from services.pb.apache.rocketmq.v2 import service_pb2 as service
from services.pb.apache.rocketmq.v2 import service_pb2_grpc as service_grpc

Code = definition.Code
SERVICE_NAME = service.DESCRIPTOR.services_by_name["MessagingService"].full_name

__all__ = ["SERVICE_NAME", "Code", "definition", "service", "service_grpc"]
