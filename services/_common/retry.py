"""Retries for calls between services (tenacity), within the caller's deadline.

Only what is safe to repeat is retried (DESIGN "Error model"):
* reads, tails, queries and offset commits (idempotent): on UNAVAILABLE and DEADLINE_EXCEEDED;
* appends: on UNAVAILABLE only (the call did not reach a working server, or the server refused
  it before writing); the commitlog service de-duplicates a retried batch by UNIQ_KEY within its
  window, so a retry after a lost reply does not store the messages twice.
"""

from __future__ import annotations

import grpc
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

IDEMPOTENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
APPEND_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})


def _is_retryable(codes: frozenset[grpc.StatusCode]):
    def predicate(exc: BaseException) -> bool:
        return isinstance(exc, grpc.RpcError) and exc.code() in codes

    return predicate


def retrying(*, idempotent: bool, deadline_s: float, attempts: int = 5) -> AsyncRetrying:
    """A tenacity policy: exponential backoff with full jitter (up to 50 ms × 2^n, at most 2 s),
    at most ``attempts``
    tries and never past ``deadline_s`` seconds in total; the last error is re-raised."""
    codes = IDEMPOTENT_CODES if idempotent else APPEND_CODES
    return AsyncRetrying(
        retry=retry_if_exception(_is_retryable(codes)),
        wait=wait_random_exponential(multiplier=0.05, max=2.0),
        stop=stop_after_attempt(attempts) | stop_after_delay(deadline_s),
        reraise=True,
    )
