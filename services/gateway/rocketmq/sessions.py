"""ClientSessions: the Telemetry streams RocketMQ 5 clients hold open to this gateway.

A client (``x-mq-client-id``, spec sheet rocketmq-grpc-v2 §2) opens one Telemetry stream per
endpoint and sends its settings there; the stream is the only way the server can send the
client anything unasked. A session is that stream's outbox of server-to-client commands and, for
a producer, the topics it publishes (from its settings and its transactional sends), so a
transaction check-back for a topic can go to a producer of it; it ends with the stream, or when
the client announces its termination. Sessions are connection state, so each gateway keeps its
own; nothing about messages or deliveries is kept here.

Bounds (``telemetryOutboxMaxCommands``, ``telemetryMaxStreamsPerClient``): an outbox holds at
most so many commands. Answers to the client's own commands wait for room (so a client that
sends without reading stops being read: HTTP/2 flow control pushes back on it), and
server-initiated commands (transaction check-backs) are dropped when there is none (the check
repeats on its next round). A client id holds at most so many streams at once; one more is
refused (TooManyRequestsError).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from libstore.errors import TooManyRequestsError

DEFAULT_OUTBOX_MAX = 64
DEFAULT_MAX_STREAMS = 16


@dataclass(eq=False)
class ClientSession:
    """One open Telemetry stream. ``outbox`` holds server-to-client commands (None ends it), at
    most ``max_outbox`` of them (module docstring); the stream's writer takes them with
    :meth:`next`. ``topics``: what a producer publishes (empty for consumers); ``owner``: the
    access key that opened it ("" with the ACL off)."""

    client_id: str
    owner: str = ""
    outbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    topics: set[str] = field(default_factory=set)
    may_publish: Callable[[str], bool] = field(default=lambda topic: True)  # the stream's ACL check
    max_outbox: int = DEFAULT_OUTBOX_MAX
    _room: asyncio.Event = field(default_factory=asyncio.Event)
    _ended: bool = False

    def offer(self, command: Any) -> bool:
        """Queue a server-initiated command unless the outbox is full or the stream ended;
        False: it was dropped."""
        if self._ended or self.outbox.qsize() >= self.max_outbox:
            return False
        self.outbox.put_nowait(command)
        return True

    async def put(self, command: Any) -> None:
        """Queue an answer, waiting while the outbox is full (the client is not reading)."""
        while self.outbox.qsize() >= self.max_outbox and not self._ended:
            self._room.clear()
            await self._room.wait()
        if not self._ended:
            self.outbox.put_nowait(command)

    async def next(self) -> Any:
        """The next command to write; None when the stream ends."""
        command = await self.outbox.get()
        self._room.set()
        return command

    def end(self) -> None:
        """End the stream: its writer stops after the commands queued before."""
        if not self._ended:
            self._ended = True
            self.outbox.put_nowait(None)  # past the bound by one: the end always gets in
            self._room.set()


class ClientSessions:
    """Open sessions by client id (a client may hold up to ``max_streams`` streams), each with
    an outbox of at most ``outbox_max`` commands."""

    def __init__(
        self, *, max_streams: int = DEFAULT_MAX_STREAMS, outbox_max: int = DEFAULT_OUTBOX_MAX
    ) -> None:
        self._by_client: dict[str, list[ClientSession]] = {}
        self.max_streams = max_streams
        self.outbox_max = outbox_max

    def open(self, client_id: str, owner: str = "") -> ClientSession:
        """A new session of ``client_id``, opened by access key ``owner``. Raises
        TooManyRequestsError when that account holds ``max_streams`` streams of the client
        already."""
        # Counted per account too: a client id is only a name, and another account's streams
        # under it must not use up this client's share.
        mine = [s for s in self._by_client.get(client_id, []) if s.owner == owner]
        if len(mine) >= self.max_streams:
            raise TooManyRequestsError(
                f"client {client_id} has {len(mine)} Telemetry streams open here, the limit is "
                f"{self.max_streams} (telemetryMaxStreamsPerClient)"
            )
        session = ClientSession(client_id, owner, max_outbox=self.outbox_max)
        self._by_client.setdefault(client_id, []).append(session)
        return session

    def sessions_of(self, client_id: str) -> list[ClientSession]:
        """The client's open sessions (a copy)."""
        return list(self._by_client.get(client_id, []))

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
            session.end()
        if not streams:
            self._by_client.pop(client_id, None)
        return len(ended)

    def end_all(self) -> int:
        """End every stream (the gateway shuts down): each completes with OK after what was
        queued; returns how many."""
        streams = [session for sessions in self._by_client.values() for session in sessions]
        for session in streams:
            session.end()
        return len(streams)

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
