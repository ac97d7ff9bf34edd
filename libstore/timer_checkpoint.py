"""TimerCheckpoint: which units of the timer queue have been delivered (libstore.scheduled_message).

Timer units are delivered in delivery-time order, not queue order, so progress is a *watermark*
(every unit below it is done) plus the set of done units at or above it. Persisted as JSON
``{"watermark": n, "done": [..], "doneQueueOffset": m}`` by atomic replace after each delivery
round. It is a cache: the log itself records each delivery (a timer-done record appended with the
delivered copy, libstore.system_topics), and ``doneQueueOffset`` says how far those records were
read, so a crash before the save, or a promoted slave's dispatch, loses no progress.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from libstore._files import atomic_write, read_json
from libstore.errors import StoreIOError


class TimerCheckpoint:
    """Delivered units of the timer queue, kept at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.watermark = 0
        self.done: set[int] = set()
        self.done_queue_offset = 0  # how far the timer-done queue has been read
        self._dirty = False

    def load(self) -> None:
        """Raises StoreIOError for an unreadable or malformed file; a missing one is empty."""
        data = read_json(self.path, "timer checkpoint")
        if data is None:
            return
        try:
            self.watermark = int(data["watermark"])
            self.done = {int(o) for o in data["done"] if int(o) >= self.watermark}
            self.done_queue_offset = int(data.get("doneQueueOffset", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreIOError(f"timer checkpoint {self.path} is malformed: {exc}") from exc

    def is_done(self, offset: int) -> bool:
        return offset < self.watermark or offset in self.done

    def mark(self, offsets: Iterable[int]) -> None:
        """Record ``offsets`` as delivered and move the watermark over the done prefix."""
        for o in offsets:
            if o >= self.watermark:
                self.done.add(o)
                self._dirty = True
        while self.watermark in self.done:
            self.done.discard(self.watermark)
            self.watermark += 1

    def skip_below(self, offset: int) -> None:
        """Everything below ``offset`` is gone from the queue (or was never there)."""
        if offset > self.watermark:
            self.watermark = offset
            self.done = {o for o in self.done if o >= offset}
            self._dirty = True
            self.mark(())

    def forget_from(self, offset: int) -> None:
        """The queue was cut at ``offset``: units from there on are new (not delivered)."""
        if self.watermark > offset:
            self.watermark = offset
        self.done = {o for o in self.done if o < offset}
        self._dirty = True

    def save(self) -> None:
        """Write the file when something changed. Raises StoreIOError."""
        if not self._dirty:
            return
        body = (
            f'{{"watermark": {self.watermark}, "done": {sorted(self.done)}, '
            f'"doneQueueOffset": {self.done_queue_offset}}}'
        )
        atomic_write(self.path, body.encode())
        self._dirty = False
