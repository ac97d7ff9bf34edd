"""ProduceAdmission: the gateway's push back (services.gateway.admission), on a real event loop,
and the status a push back travels as."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from libstore.errors import SystemBusyError, TooManyRequestsError
from services._common.errors import RETRY_PUSHBACK_KEY, status_code_of, store_error_of, to_rpc_status
from services.gateway.admission import BYTES_RETRY_MS, MAX_RETRY_MS, ProduceAdmission


def test_bytes_in_flight_are_bounded_and_released() -> None:
    async def run() -> None:
        admission = ProduceAdmission(max_queue_wait_ms=10_000, max_inflight_bytes=150)
        try:
            with admission.admit(100):
                assert admission.inflight_bytes == 100
                with pytest.raises(SystemBusyError) as refused, admission.admit(60):
                    raise AssertionError("admitted past the bound")
                assert refused.value.retry_after_ms == BYTES_RETRY_MS
                assert "maxInflightProduceBytes" in str(refused.value)
                assert admission.inflight_bytes == 100  # a refusal holds nothing
                with admission.admit(50):
                    assert admission.inflight_bytes == 150
            assert admission.inflight_bytes == 0
            # With nothing held one call is admitted whatever its size.
            with admission.admit(1_000):
                assert admission.inflight_bytes == 1_000
            with pytest.raises(RuntimeError), admission.admit(40):
                raise RuntimeError("the append failed")
            assert admission.inflight_bytes == 0
            assert admission.refused == 1
        finally:
            await admission.close()

    asyncio.run(run())


def test_a_loop_that_stays_behind_refuses_until_it_catches_up_and_one_stall_refuses_nothing() -> None:
    async def stall(admission: ProduceAdmission) -> None:
        """Block the loop for 300 ms, then run it until the sampler has measured that."""
        taken = admission.lag_ms
        time.sleep(0.3)  # the loop is blocked: a call would wait this long before running
        deadline = time.monotonic() + 5
        while admission.lag_ms == taken and time.monotonic() < deadline:
            await asyncio.sleep(0)
        assert admission.lag_ms > 100

    async def run() -> None:
        admission = ProduceAdmission(max_queue_wait_ms=100, max_inflight_bytes=1 << 20, sample_interval_ms=5)
        try:
            with admission.admit(10):
                pass  # starts the sampler
            await asyncio.sleep(0.01)  # ... which is now waiting for its next sample
            await stall(admission)
            with admission.admit(10):  # one stall, over by now: no backlog to push back on
                assert admission.refused == 0
            await stall(admission)  # the next sample is late too: the loop stays behind
            with pytest.raises(SystemBusyError) as refused, admission.admit(10):
                raise AssertionError("admitted while the loop lags")
            assert 100 < refused.value.retry_after_ms <= MAX_RETRY_MS
            assert "waitTimeMillsInSendQueue" in str(refused.value)
            assert admission.inflight_bytes == 0
            await asyncio.sleep(0.05)  # the loop is idle again: the next samples say so
            with admission.admit(10):
                assert admission.inflight_bytes == 10
        finally:
            await admission.close()

    asyncio.run(run())


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ProduceAdmission(0, 10)
    with pytest.raises(ValueError):
        ProduceAdmission(10, 0)


def test_a_push_back_is_resource_exhausted_with_both_standard_retry_hints() -> None:
    exc = SystemBusyError("broker busy", retry_after_ms=1_250)
    assert isinstance(exc, TooManyRequestsError)
    status = to_rpc_status(exc)
    assert status.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = dict(status.trailing_metadata)
    assert trailers[RETRY_PUSHBACK_KEY] == "1250"
    proto = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    infos = [d for d in proto.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(infos) == 1
    retry = error_details_pb2.RetryInfo()
    infos[0].Unpack(retry)
    assert retry.retry_delay.ToMilliseconds() == 1_250
    # The error crosses services with its hint; other errors carry no pushback trailer.
    again = SystemBusyError.from_details("broker busy", exc.details())
    assert isinstance(again, SystemBusyError) and again.retry_after_ms == 1_250
    assert isinstance(store_error_of("SYSTEM_BUSY", "x"), SystemBusyError)
    assert status_code_of(TooManyRequestsError("x")) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert RETRY_PUSHBACK_KEY not in dict(to_rpc_status(TooManyRequestsError("x")).trailing_metadata)
