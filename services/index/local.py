"""LocalIndex: the IndexPort over this process's IndexService."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from libstore import InvalidArgumentError
from libstore.index_service import IndexService
from services._common.telemetry import tracer
from services.ports import DerivedStatus

MAX_TIMESTAMP = 2**63 - 1


class LocalIndex:
    """``settle``: awaited before each query, so what the log confirmed before it is applied
    (IndexApp.settle; None: answer from what is applied)."""

    def __init__(
        self,
        index: IndexService,
        status_of: Callable[[], DerivedStatus],
        settle: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.index = index
        self._status_of = status_of
        self._settle = settle
        self._tracer = tracer("mqstore.index")

    async def query_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int
    ) -> list[int]:
        if not topic or not key:
            raise InvalidArgumentError("topic and key must be non-empty")
        if max_count <= 0:
            raise InvalidArgumentError(f"max_count must be > 0, got {max_count}")
        with self._tracer.start_as_current_span("index.query"):
            if self._settle is not None:
                await self._settle()
            return self.index.query_offsets(topic, key, max_count, begin_ms, end_ms or MAX_TIMESTAMP)

    async def status(self) -> DerivedStatus:
        return self._status_of()
