"""Calls between services (services._common.remote.call): the first attempt goes out without
setting up the retry policy, and a failed one becomes the policy's first attempt, so what is
retried, how often and within what deadline stays services._common.retry's."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from libstore.errors import InvalidArgumentError, ServiceNotAvailableError
from services._common.remote import call
from services._common.telemetry import client_interceptors, configure_tracing


def _failure(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=code.name)


class _Method:
    """An RPC method that fails with ``codes`` in turn, then answers "ok"."""

    def __init__(self, *codes: grpc.StatusCode) -> None:
        self.codes = list(codes)
        self.timeouts: list[float] = []

    async def __call__(self, request: object, *, timeout: float) -> str:
        self.timeouts.append(timeout)
        if self.codes:
            raise _failure(self.codes.pop(0))
        return "ok"


def _run(method: _Method, *, idempotent: bool, timeout_s: float = 10.0) -> object:
    return asyncio.run(call(method, "req", idempotent=idempotent, timeout_s=timeout_s))


def test_a_call_that_succeeds_at_once_is_made_once_with_the_whole_deadline() -> None:
    method = _Method()
    assert _run(method, idempotent=True, timeout_s=3.0) == "ok"
    assert method.timeouts == [3.0]


def test_a_failed_first_attempt_is_retried_by_the_policy() -> None:
    method = _Method(grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert _run(method, idempotent=True) == "ok"
    assert len(method.timeouts) == 3
    assert method.timeouts[1] <= 10.0 and method.timeouts[2] < method.timeouts[1]  # what is left


def test_five_attempts_in_all_then_the_last_error() -> None:
    method = _Method(*[grpc.StatusCode.UNAVAILABLE] * 9)
    with pytest.raises(ServiceNotAvailableError):
        _run(method, idempotent=True)
    assert len(method.timeouts) == 5


def test_what_is_not_safe_to_repeat_is_not_repeated() -> None:
    append = _Method(grpc.StatusCode.DEADLINE_EXCEEDED)  # an append may have been written
    with pytest.raises(grpc.RpcError) as raised:
        _run(append, idempotent=False)
    assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED and len(append.timeouts) == 1
    refused = _Method(grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(InvalidArgumentError):
        _run(refused, idempotent=True)
    assert len(refused.timeouts) == 1


def test_channels_get_client_span_interceptors_only_while_spans_are_exported() -> None:
    sampler = configure_tracing().sampler
    before = sampler.exporting  # type: ignore[attr-defined]
    try:
        sampler.exporting = False  # type: ignore[attr-defined]
        assert client_interceptors() == []
        sampler.exporting = True  # type: ignore[attr-defined]
        assert client_interceptors()
    finally:
        sampler.exporting = before  # type: ignore[attr-defined]
