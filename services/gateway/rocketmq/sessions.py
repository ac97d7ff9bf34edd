"""ClientSessions: the Telemetry streams RocketMQ 5 clients hold open to this gateway.

A client (``x-mq-client-id``, spec sheet rocketmq-grpc-v2 §2) opens one Telemetry stream per
endpoint and sends its settings there; the stream is the only way the server can send the
client anything unasked. A session is that stream's outbox of server-to-client commands and, for
a producer, the topics it publishes (from its settings and its transactional sends), so a
transaction check-back for a topic can go to a producer of it; it ends with the stream, or when
the client announces its termination. Sessions are connection state, so each gateway keeps its
own; nothing about messages or deliveries is kept here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class ClientSession:
    """One open Telemetry stream. ``outbox`` holds server-to-client commands (None ends it);
    ``topics``: what a producer publishes (empty for consumers); ``owner``: the access key that
    opened it ("" with the ACL off)."""

    client_id: str
    owner: str = ""
    outbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    topics: set[str] = field(default_factory=set)
    may_publish: Callable[[str], bool] = field(default=lambda topic: True)  # the stream's ACL check


class ClientSessions:
    """Open sessions by client id (a client may hold several streams)."""

    def __init__(self) -> None:
        self._by_client: dict[str, list[ClientSession]] = {}

    def open(self, client_id: str, owner: str = "") -> ClientSession:
        """A new session of ``client_id``, opened by access key ``owner``."""
        session = ClientSession(client_id, owner)
        self._by_client.setdefault(client_id, []).append(session)
        return session

    def close(self, session: ClientSession) -> None:
        streams = self._by_client.get(session.client_id, [])
        if session in streams:
            streams.remove(session)
        if not streams:
            self._by_client.pop(session.client_id, None)

    def drop(self, client_id: str, owner: str = "") -> int:
        """The client said it terminates: end its streams that access key ``owner`` opened (a
        client id is only a name: another account's streams of the same id stay). Returns how
        many ended."""
        streams = self._by_client.get(client_id, [])
        ended = [s for s in streams if s.owner == owner]
        for session in ended:
            streams.remove(session)
            session.outbox.put_nowait(None)
        if not streams:
            self._by_client.pop(client_id, None)
        return len(ended)

    def has_client(self, client_id: str) -> bool:
        """Whether the client has a Telemetry stream open here."""
        return bool(self._by_client.get(client_id))

    def add_topics(self, client_id: str, topics: set[str]) -> None:
        """The client publishes ``topics`` (its sessions learn them)."""
        for session in self._by_client.get(client_id, []):
            session.topics |= topics

    def producer_topics(self) -> set[str]:
        """Topics some open session publishes."""
        out: set[str] = set()
        for streams in self._by_client.values():
            for session in streams:
                out |= session.topics
        return out

    def producer_of(self, topic: str) -> ClientSession | None:
        """An open session that publishes ``topic`` (the most recently opened), or None."""
        for streams in reversed(list(self._by_client.values())):
            for session in reversed(streams):
                if topic in session.topics:
                    return session
        return None
