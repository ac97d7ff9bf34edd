"""Bounds on what one client call may ask of a gateway, and the count of held long polls.

:class:`GatewayLimits` gathers the gateway's bounds from its StoreConfig (one place, so both
APIs on the port apply the same numbers): messages and bytes per produce or send, the largest
record a by-id query reads, held long polls in total and per client connection, and the
Telemetry bounds of the RocketMQ 5 protocol, and the push back on produce
(services.gateway.admission).

:class:`HeldPolls` counts the long polls being held (own API Pull with a wait, RocketMQ 5
ReceiveMessage) per client connection (the gRPC peer, ``ipv4:host:port``) and in total. A poll
that may not be held is answered at once with what there is; when there is nothing, the caller
answers "too many requests" (RESOURCE_EXHAUSTED / TOO_MANY_REQUESTS), as RocketMQ answers a
flow-controlled request, rather than holding one more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from libstore import StoreConfig
from libstore.config import RECORD_OVERHEAD_BOUND


@dataclass(frozen=True)
class GatewayLimits:
    """The gateway's bounds; field names are the StoreConfig fields they come from (sizes in
    bytes). Defaults are StoreConfig's."""

    max_messages_per_request: int = 1024
    max_request_bytes: int = 32 * 1024 * 1024
    max_message_size: int = 4 * 1024 * 1024
    max_held_polls: int = 4096
    max_held_polls_per_client: int = 64
    telemetry_outbox_max_commands: int = 64
    telemetry_max_streams_per_client: int = 16
    offload_validation_bytes: int = 2 * 1024 * 1024
    wait_time_mills_in_send_queue: int = 200
    max_inflight_produce_bytes: int = 256 * 1024 * 1024

    @classmethod
    def from_config(cls, config: StoreConfig) -> GatewayLimits:
        """The bounds ``config`` sets."""
        return cls(
            max_messages_per_request=config.max_messages_per_request,
            max_request_bytes=config.max_request_bytes,
            max_message_size=config.max_message_size,
            max_held_polls=config.max_held_polls,
            max_held_polls_per_client=config.max_held_polls_per_client,
            telemetry_outbox_max_commands=config.telemetry_outbox_max_commands,
            telemetry_max_streams_per_client=config.telemetry_max_streams_per_client,
            offload_validation_bytes=config.offload_validation_bytes,
            wait_time_mills_in_send_queue=config.wait_time_mills_in_send_queue,
            max_inflight_produce_bytes=config.max_inflight_produce_bytes,
        )

    @property
    def max_record_size(self) -> int:
        """The largest CommitLog record a message of ``max_message_size`` makes (bytes)."""
        return self.max_message_size + RECORD_OVERHEAD_BOUND

    def request_problem(self, messages: int, size: int) -> str:
        """Why a request of ``messages`` messages and ``size`` encoded bytes is refused, or ""
        when it is within bounds."""
        if messages > self.max_messages_per_request:
            return (
                f"a request carries at most {self.max_messages_per_request} messages "
                f"(maxMessagesPerRequest), got {messages}"
            )
        if size > self.max_request_bytes:
            return f"a request carries at most {self.max_request_bytes} bytes (maxRequestBytes), got {size}"
        return ""


class HeldPolls:
    """Long polls held now, per client connection and in total (module docstring). Used from
    the event loop only."""

    def __init__(self, max_total: int, max_per_client: int) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self._by_peer: dict[str, int] = {}
        self._total = 0

    @property
    def held(self) -> int:
        """How many polls are held now."""
        return self._total

    @contextlib.contextmanager
    def hold(self, peer: str) -> Iterator[bool]:
        """Within the block the poll counts as held when the context gives True; False: the
        bounds are reached, the caller must not wait (nothing is counted)."""
        count = self._by_peer.get(peer, 0)
        if self._total >= self.max_total or count >= self.max_per_client:
            yield False
            return
        self._by_peer[peer] = count + 1
        self._total += 1
        try:
            yield True
        finally:
            self._total -= 1
            left = self._by_peer[peer] - 1
            if left:
                self._by_peer[peer] = left
            else:
                del self._by_peer[peer]
