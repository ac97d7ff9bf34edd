"""LogGeneration: the CommitLog's truncation history, for the services that follow it.

Dispatch and index apply the log as it grows and remember how far they got. If the log then
loses a tail (abnormal recovery cut it, or a returning master dropped bytes its successor never
had) and grows again, a follower's offset may land in new, different records: it must first
drop what it derived from the lost bytes. Offsets alone cannot tell, so the log keeps a
generation number, bumped before every truncation, with the offset cut at:

    {"logId": "<random hex>", "generation": G, "cuts": [[g, offset], ...]}

A follower saves ``(logId, generation)`` with its own checkpoint. :meth:`divergence_point`
answers "what must a follower that last read generation g cut back to?": the lowest offset cut
by any later generation (0 for another log), or None when nothing it read was cut.

mqstore-specific (RocketMQ keeps ConsumeQueues in the broker process and truncates them during
its own recovery); the file is ``config/logGeneration.json``, replaced atomically.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from pathlib import Path

from libstore._files import atomic_write, read_json
from libstore.errors import StoreIOError

log = logging.getLogger(__name__)

MAX_CUTS = 256


class LogGeneration:
    """The truncation history of one CommitLog (see module docstring). Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.log_id = ""
        self.generation = 1
        self._cuts: list[tuple[int, int]] = []
        try:
            raw = read_json(self.path, "log generation")
            if raw is not None:
                self.log_id = str(raw["logId"])
                self.generation = int(raw["generation"])
                self._cuts = [(int(g), int(o)) for g, o in raw.get("cuts", [])]
        except (StoreIOError, ValueError, KeyError, TypeError) as exc:
            # Unreadable: start a new identity, so every follower rebuilds (safe, never wrong).
            log.warning("log generation file %s is unreadable (%s); starting a new log id", self.path, exc)
            self.log_id = ""
        if not self.log_id:
            self.log_id = uuid.uuid4().hex
            self.generation = 1
            self._cuts = []
            self._persist_locked()

    def _persist_locked(self) -> None:
        data = {"logId": self.log_id, "generation": self.generation, "cuts": self._cuts}
        atomic_write(self.path, json.dumps(data).encode("utf-8"))

    def bump(self, cut_offset: int) -> int:
        """Start a new generation because the log is about to be cut at ``cut_offset``; persisted
        before it returns (call it before truncating). Returns the new generation."""
        with self._lock:
            self.generation += 1
            self._cuts.append((self.generation, cut_offset))
            if len(self._cuts) > MAX_CUTS:
                # Merge the two oldest: followers between them are cut a little further back.
                (_, o1), (g2, o2) = self._cuts[0], self._cuts[1]
                self._cuts[:2] = [(g2, min(o1, o2))]
            self._persist_locked()
            gen = self.generation
        log.info("CommitLog generation %d: cut at offset %d", gen, cut_offset)
        return gen

    def divergence_point(self, log_id: str, generation: int) -> int | None:
        """Where a follower that last read ``(log_id, generation)`` must cut back to, or None
        when nothing it may have read was cut. ``generation`` ≤ 0 means "unknown": None."""
        if generation <= 0:
            return None
        with self._lock:
            if log_id != self.log_id or generation > self.generation:
                return 0
            cuts = [o for g, o in self._cuts if g > generation]
        return min(cuts) if cuts else None
