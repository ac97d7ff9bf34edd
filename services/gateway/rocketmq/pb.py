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


class _Codes:
    """``apache.rocketmq.v2.Code``'s values as plain int attributes (``Code.OK``), with ``Name``
    and ``Value`` as the generated enum has them. The generated wrapper answers every value
    through a Python ``__getattr__`` (about 0.8 µs an access on this project's hosts), and each
    call's answer names several."""

    def __init__(self) -> None:
        self.__dict__.update(definition.Code.items())

    def __getattr__(self, name: str) -> int:  # only for names that are no Code value
        raise AttributeError(f"apache.rocketmq.v2.Code has no value {name}")

    @staticmethod
    def Name(number: int) -> str:
        """The value's name; ValueError for a number that is no Code value."""
        return definition.Code.Name(number)

    @staticmethod
    def Value(name: str) -> int:
        """The named value; ValueError for a name that is no Code value."""
        return definition.Code.Value(name)


Code = _Codes()
SERVICE_NAME = service.DESCRIPTOR.services_by_name["MessagingService"].full_name

__all__ = ["SERVICE_NAME", "Code", "definition", "service", "service_grpc"]
