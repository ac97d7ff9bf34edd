"""The error maps (StoreError -> gRPC status code, StoreError -> RocketMQ 5 code) follow the
StoreError tree: an error takes its nearest mapped class's entry, whatever order the map is
written in."""

from __future__ import annotations

import grpc
import pytest

from libstore import errors as E
from services._common import errors as rpc_errors
from services.gateway.rocketmq import convert
from services.gateway.rocketmq.pb import Code

ALL = [c for c in vars(E).values() if isinstance(c, type) and issubclass(c, E.StoreError)]


def _error(cls: type[E.StoreError]) -> E.StoreError:
    return cls.from_details("boom", {})


@pytest.mark.parametrize(
    ("cls", "status", "v2"),
    [
        (E.DiskFullError, grpc.StatusCode.RESOURCE_EXHAUSTED, Code.TOO_MANY_REQUESTS),  # not its base's
        (E.StoreIOError, grpc.StatusCode.UNAVAILABLE, Code.INTERNAL_SERVER_ERROR),
        (E.SystemBusyError, grpc.StatusCode.RESOURCE_EXHAUSTED, Code.TOO_MANY_REQUESTS),  # its base's
        (E.NotMasterError, grpc.StatusCode.FAILED_PRECONDITION, Code.HA_NOT_AVAILABLE),
        (E.ServiceNotAvailableError, grpc.StatusCode.UNAVAILABLE, Code.INTERNAL_SERVER_ERROR),
        (E.IllegalTopicError, grpc.StatusCode.INVALID_ARGUMENT, Code.ILLEGAL_TOPIC),
        (E.QueueIdOutOfRangeError, grpc.StatusCode.INVALID_ARGUMENT, Code.BAD_REQUEST),
        (E.InvalidReceiptHandleError, grpc.StatusCode.INVALID_ARGUMENT, Code.INVALID_RECEIPT_HANDLE),
        (E.TooManyTopicsError, grpc.StatusCode.INVALID_ARGUMENT, Code.BAD_REQUEST),
        (E.StoreError, grpc.StatusCode.INTERNAL, Code.INTERNAL_SERVER_ERROR),  # nothing mapped
    ],
)
def test_an_error_takes_its_nearest_mapped_class(
    cls: type[E.StoreError], status: grpc.StatusCode, v2: int
) -> None:
    assert rpc_errors.status_code_of(_error(cls)) is status
    assert convert.code_of_error(_error(cls)) == v2


@pytest.mark.parametrize("table", [rpc_errors._CODES, convert._V2_CODES], ids=["grpc", "rocketmq"])
def test_the_order_a_map_is_written_in_changes_nothing(table: dict[type[BaseException], object]) -> None:
    reversed_table = dict(reversed(table.items()))
    for cls in ALL:
        assert E.nearest_entry(table, _error(cls), None) == E.nearest_entry(reversed_table, _error(cls), None)
    # A subclass with an entry of its own takes it, wherever its base's entry stands.
    overridden = [c for c in ALL if c in table and any(b in table for b in c.__mro__[1:])]
    assert overridden, "the map has no subclass entry to check"
    for sub in overridden:
        assert E.nearest_entry(table, _error(sub), None) == table[sub]
