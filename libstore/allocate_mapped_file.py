"""AllocateMappedFileService: creates the next CommitLog segment ahead of need (spec sheet §6).

Asking for segment N also queues N+1, so by the time the writer fills N, N+1 already exists
(blocks allocated, optionally preloaded or warmed). The caller waits at most ``wait_timeout_ms``
for N. Requests are served largest size first, then lowest offset. Segments created ahead but
never taken are deleted at shutdown.

When a log is cut back (truncation, a slave's reset), segments created ahead for offsets past
the new end are deleted too (:meth:`discard_from`): left on disk, they would sit after a gap
once the log grew again in other segments, and the next start refuses a log with a gap.

Thread-safety: any thread may request; one background thread creates files.
"""

from __future__ import annotations

import heapq
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from libstore.errors import StoreError, StoreIOError
from libstore.mapped_file import MappedFile
from libstore.service_thread import ServiceThread
from libstore.transient_store_pool import TransientStorePool

log = logging.getLogger(__name__)


@dataclass
class _AllocateRequest:
    path: Path
    file_size: int
    done: threading.Event = field(default_factory=threading.Event)
    mapped_file: MappedFile | None = None
    error: StoreError | None = None
    discarded: bool = False


class AllocateMappedFileService(ServiceThread):
    """Background creation of segments; see the module docstring.

    ``preload``/``warm``/``warm_flush_pages`` are passed to :meth:`MappedFile.create`;
    ``transient_store_pool`` gives each segment a write buffer; with ``fast_fail_if_no_buffer``
    a request is refused (None) when the pool is empty.
    """

    def __init__(
        self,
        *,
        preload: bool = False,
        warm: bool = False,
        warm_flush_pages: int = 0,
        transient_store_pool: TransientStorePool | None = None,
        fast_fail_if_no_buffer: bool = False,
        wait_timeout_ms: int = 5000,
    ) -> None:
        super().__init__("AllocateMappedFileService")
        self.preload = preload
        self.warm = warm
        self.warm_flush_pages = warm_flush_pages
        self.pool = transient_store_pool
        self.fast_fail_if_no_buffer = fast_fail_if_no_buffer
        self.wait_timeout_ms = wait_timeout_ms
        self._lock = threading.Lock()
        self._requests: dict[Path, _AllocateRequest] = {}
        self._heap: list[tuple[int, str, Path]] = []
        self._has_work = threading.Condition(self._lock)

    def put_request_and_return_mapped_file(
        self, next_path: Path, next_next_path: Path | None, file_size: int
    ) -> MappedFile | None:
        """Create (or take the pre-created) segment ``next_path`` and queue ``next_next_path``.

        Returns None when the wait times out or the pool has no buffer (fast fail); raises the
        StoreError (e.g. DiskFullError) the creation hit.
        """
        if self.stopped:
            raise StoreIOError("allocation service is stopped")
        if self.fast_fail_if_no_buffer and self.pool is not None and self.pool.available_buffer_nums == 0:
            log.warning("no transient buffer left for %s", next_path.name)
            return None
        with self._lock:
            req = self._enqueue(next_path, file_size)
            if next_next_path is not None and (
                self.pool is None or self.pool.available_buffer_nums > len(self._requests)
            ):
                self._enqueue(next_next_path, file_size)
            self._has_work.notify()
        if not req.done.wait(self.wait_timeout_ms / 1000.0):
            log.warning("creating %s took longer than %d ms", next_path.name, self.wait_timeout_ms)
            return None
        with self._lock:
            self._requests.pop(next_path, None)
        if req.error is not None:
            raise req.error
        return req.mapped_file

    def _enqueue(self, path: Path, file_size: int) -> _AllocateRequest:
        req = self._requests.get(path)
        if req is None or req.error is not None:
            # A failed creation (disk full) is retried afresh: space may have come back since.
            req = _AllocateRequest(path, file_size)
            self._requests[path] = req
            heapq.heappush(self._heap, (-file_size, path.name, path))
        return req

    def discard_from(self, folder: Path, offset: int) -> list[Path]:
        """Delete the segments of ``folder`` created (or being created) ahead for a start offset
        at or past ``offset``, and forget their requests; returns their paths. A creation in
        progress is deleted as soon as it completes."""
        with self._lock:
            gone = [
                req
                for path, req in self._requests.items()
                if path.parent == folder and int(path.name) >= offset
            ]
            for req in gone:
                del self._requests[req.path]
                req.discarded = True
            self._heap = [h for h in self._heap if h[2] in self._requests]
            heapq.heapify(self._heap)
            created = [req.mapped_file for req in gone if req.done.is_set() and req.mapped_file is not None]
        for mf in created:  # the others are deleted by the creating thread (it sees ``discarded``)
            mf.destroy()
            log.info("deleted %s, created ahead past the log's new end", mf.file_name)
        return [req.path for req in gone]

    def run_loop(self) -> None:
        with self._lock:
            while not self._heap and not self.stopped:
                self._has_work.wait(1.0)
            if self.stopped:
                return
            _, _, path = heapq.heappop(self._heap)
            req = self._requests.get(path)
        if req is None or req.done.is_set():
            return
        try:
            req.mapped_file = MappedFile.create(
                req.path,
                req.file_size,
                preload=self.preload,
                warm=self.warm,
                warm_flush_pages=self.warm_flush_pages,
                transient_store_pool=self.pool,
            )
        except StoreError as exc:
            req.error = exc
        with self._lock:
            req.done.set()
            discarded = req.discarded
        if discarded and req.mapped_file is not None:
            req.mapped_file.destroy()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop, then delete segments created ahead that nobody took."""
        with self._lock:
            self._stopped.set()
            self._has_work.notify_all()
        super().shutdown(timeout_s)
        with self._lock:
            leftovers = list(self._requests.values())
            self._requests.clear()
            self._heap.clear()
        for req in leftovers:
            if req.mapped_file is not None:
                req.mapped_file.destroy()
