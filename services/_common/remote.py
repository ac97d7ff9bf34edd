"""What every remote port shares: a traced channel, and unary calls with a deadline, tenacity
retries (only where repeating is safe, see :mod:`services._common.retry`) and errors mapped back
to libstore's StoreError classes."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from services._common.errors import store_error_from_rpc
from services._common.retry import retrying
from services._common.server import CHANNEL_OPTIONS
from services._common.telemetry import client_interceptors
from services._common.tls import TlsConfig

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0


def open_channel(address: str, tls: TlsConfig | None = None) -> grpc.aio.Channel:
    """A channel to ``address`` ("host:port") with tracing interceptors: TLS with ``tls``'s CA
    and client certificate (see :mod:`services._common.tls`), plaintext when ``tls`` is None."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=client_interceptors())
    return grpc.aio.secure_channel(
        address,
        tls.channel_credentials(),
        options=[*CHANNEL_OPTIONS, *tls.channel_options()],
        interceptors=client_interceptors(),
    )


async def call(
    method: Callable[..., Awaitable[T]],
    request: Any,
    *,
    idempotent: bool,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> T:
    """``await method(request)`` within ``timeout_s`` in total, retried per the policy; a failed
    call raises the matching StoreError (grpc.RpcError when it has no store meaning)."""
    deadline = time.monotonic() + timeout_s
    try:
        # The first attempt outside the retry policy: nearly every call succeeds at once, and
        # setting the policy up costs ~80 us a call. A failure becomes the policy's first attempt.
        try:
            return await method(request, timeout=timeout_s)
        except grpc.RpcError as err:
            first: grpc.RpcError | None = err
        async for attempt in retrying(idempotent=idempotent, deadline_s=timeout_s):
            with attempt:
                if first is not None:
                    failed, first = first, None
                    raise failed
                left = max(0.001, deadline - time.monotonic())
                return await method(request, timeout=left)
    except grpc.RpcError as err:
        mapped = store_error_from_rpc(err)
        if mapped is not None:
            raise mapped from None
        raise
    raise AssertionError("unreachable")  # pragma: no cover


def reraise_mapped(err: grpc.RpcError) -> NoReturn:
    """Raise the StoreError ``err`` stands for, else ``err`` itself."""
    mapped = store_error_from_rpc(err)
    if mapped is not None:
        raise mapped from None
    raise err
