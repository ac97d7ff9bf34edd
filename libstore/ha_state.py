"""HAState: a store's replication role and master epochs, persisted (``config/haState.json``).

Epochs (the term of one master, as RocketMQ 5's ``EpochFileCache``): each time a store becomes
the master of its broker group it starts epoch ``e`` at its current CommitLog end (the services
number them :func:`next_epoch`: term * 1000 + broker id, unique per member); the history
is a list of :class:`EpochEntry` (epoch, start offset), strictly increasing in epoch and
non-decreasing in start offset. Entry ``i`` covers ``[start_i, start_{i+1})`` and the last one
runs to the log's end. A slave copies its master's entries as the bytes they describe arrive,
so two stores that hold the same entry hold the same bytes for it up to the shorter end.

:func:`find_consistent_point` is how a returning store learns what to cut: the end of the
newest epoch both histories share (same epoch, same start), at the shorter of the two ends.

The role saved here (``brokerRole``, ``haMasterAddress``) is the store's current role after a
promotion or demotion; on restart it overrides the configured one, so a demoted master comes
back as a slave and a promoted slave as the master.

The file is small JSON replaced atomically (temp file, fsync, rename).
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from libstore._files import atomic_write, read_json
from libstore.config import MAX_BROKER_ID, BrokerRole
from libstore.errors import ConfigError, StoreIOError

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class EpochEntry:
    """Master term ``epoch`` (≥ 1) whose first byte is at CommitLog offset ``start_offset``."""

    epoch: int
    start_offset: int


def next_epoch(above: int, broker_id: int) -> int:
    """The epoch a member ``broker_id`` begins after the newest it knows (``above``): the next
    term, ``term * MAX_BROKER_ID + broker_id`` past ``above``. No two members ever begin the same
    epoch, so two that each started a term without hearing of the other (a restart during a
    partition) never take each other's bytes for their own: their histories share nothing past
    the last common term, and the newer number wins."""
    return (above // MAX_BROKER_ID + 1) * MAX_BROKER_ID + broker_id


def end_of(entries: list[EpochEntry], index: int, max_offset: int) -> int:
    """End offset (exclusive) of ``entries[index]`` in a log ending at ``max_offset``."""
    if index + 1 < len(entries):
        return entries[index + 1].start_offset
    return max(max_offset, entries[index].start_offset)


def find_consistent_point(
    local: list[EpochEntry], local_max: int, remote: list[EpochEntry], remote_max: int
) -> int:
    """The offset up to which two logs with these epoch histories hold the same bytes.

    Newest shared epoch (same number and start offset) wins; the answer is the smaller of its
    two end offsets. Returns -1 when the histories share no epoch (the logs are unrelated, or
    one of them has no history). Source: RocketMQ 5 ``EpochFileCache.findConsistentPoint``.
    """
    by_epoch = {e.epoch: (i, e) for i, e in enumerate(remote)}
    for i in range(len(local) - 1, -1, -1):
        entry = local[i]
        hit = by_epoch.get(entry.epoch)
        if hit is None or hit[1].start_offset != entry.start_offset:
            continue
        j = hit[0]
        return min(end_of(local, i, local_max), end_of(remote, j, remote_max))
    return -1


class HAState:
    """The persisted HA state of one store (see module docstring). Thread-safe.

    ``path`` is the JSON file; a missing file means "no epochs yet, role as configured".
    Raises StoreIOError when the file cannot be written, ConfigError when it does not parse.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.role: BrokerRole | None = None
        self.master_address = ""
        self._epochs: list[EpochEntry] = []
        self._load()

    def _load(self) -> None:
        try:
            raw = read_json(self.path, "HA state")
        except StoreIOError as exc:
            raise ConfigError(str(exc)) from exc
        if raw is None:
            return
        try:
            role = raw.get("brokerRole")
            self.role = BrokerRole(role) if role else None
            self.master_address = str(raw.get("haMasterAddress", ""))
            self._epochs = [EpochEntry(int(e), int(s)) for e, s in raw.get("epochs", [])]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"HA state {self.path} is malformed: {exc}") from exc
        _check_history(self._epochs, str(self.path))

    def _replace_locked(self, epochs: list[EpochEntry]) -> None:
        """Make ``epochs`` the history and persist it, unless it is the current one (lock held)."""
        if epochs != self._epochs:
            self._epochs = epochs
            self._persist_locked()

    def _persist_locked(self) -> None:
        data = {
            "brokerRole": self.role.value if self.role else "",
            "haMasterAddress": self.master_address,
            "epochs": [[e.epoch, e.start_offset] for e in self._epochs],
        }
        atomic_write(self.path, json.dumps(data, indent=1).encode("utf-8"))

    # -- epochs -------------------------------------------------------------------------------
    @property
    def epochs(self) -> list[EpochEntry]:
        """A copy of the epoch history, oldest first."""
        with self._lock:
            return list(self._epochs)

    @property
    def last_epoch(self) -> int:
        """The newest epoch (0 when there is none)."""
        with self._lock:
            return self._epochs[-1].epoch if self._epochs else 0

    def start_epoch(self, epoch: int, start_offset: int) -> EpochEntry:
        """Record that this store starts master term ``epoch`` at ``start_offset`` (persisted
        before it returns). Raises ValueError when the epoch is not newer than the last one or
        the offset is before the last entry's start."""
        entry = EpochEntry(epoch, start_offset)
        with self._lock:
            if self._epochs and (
                epoch <= self._epochs[-1].epoch or start_offset < self._epochs[-1].start_offset
            ):
                raise ValueError(f"epoch {entry} does not follow {self._epochs[-1]}")
            self._epochs.append(entry)
            self._persist_locked()
        log.info("epoch %d starts at CommitLog offset %d", epoch, start_offset)
        return entry

    def begin_term(self, start_offset: int, min_epoch: int = 0) -> EpochEntry:
        """Record that this store becomes the master from ``start_offset`` (its log end): a new
        epoch, ``max(last epoch + 1, min_epoch)``, persisted before it returns. Every start,
        restart or promotion of a master begins one, so bytes written after a restart are
        never taken for bytes of the same epoch that a slave received before it (and the master
        lost in the crash). Raises ValueError when ``start_offset`` is before the last entry's
        start (the caller clamps a shortened log first, :meth:`clamp`)."""
        with self._lock:
            last = self._epochs[-1].epoch if self._epochs else 0
        return self.start_epoch(max(last + 1, min_epoch), start_offset)

    def adopt(self, entries: list[EpochEntry], max_offset: int) -> None:
        """Take a master's history for a log that now ends at ``max_offset``: entries that
        start past it are left out (:meth:`extend_to` adds them as the bytes arrive)."""
        kept = [e for e in entries if e.start_offset <= max_offset]
        _check_history(kept, "the master's epochs")
        with self._lock:
            self._replace_locked(kept)

    def extend_to(self, pending: list[EpochEntry], max_offset: int) -> list[EpochEntry]:
        """Append the entries of ``pending`` (a master's history, newer than ours) that start at
        or before ``max_offset`` (persisted when any was new); return those still pending."""
        take = [e for e in pending if e.start_offset <= max_offset]
        if not take:
            return pending
        with self._lock:
            extended = list(self._epochs)
            for e in take:
                if not extended or e.epoch > extended[-1].epoch:
                    extended.append(e)
            self._replace_locked(extended)
        return [e for e in pending if e.start_offset > max_offset]

    def truncate(self, max_offset: int) -> None:
        """The log was cut at ``max_offset``: forget epochs that start past it."""
        with self._lock:
            self._replace_locked([e for e in self._epochs if e.start_offset <= max_offset])

    def clamp(self, max_offset: int) -> None:
        """A master's log ended up shorter than its own epochs say (a crash lost the unflushed
        tail): epochs that start past the end now start at the end, keeping their numbers, so
        the bytes written next belong to the newest epoch and no older number is reused."""
        with self._lock:
            self._replace_locked([EpochEntry(e.epoch, min(e.start_offset, max_offset)) for e in self._epochs])

    # -- role ---------------------------------------------------------------------------------
    def save_role(self, role: BrokerRole, master_address: str = "") -> None:
        """Persist the store's current role (and, for a SLAVE, its master's HA address)."""
        with self._lock:
            self.role = role
            self.master_address = master_address if role is BrokerRole.SLAVE else ""
            self._persist_locked()


def _check_history(entries: list[EpochEntry], where: str) -> None:
    for a, b in itertools.pairwise(entries):
        if b.epoch <= a.epoch or b.start_offset < a.start_offset:
            raise ConfigError(f"epoch history in {where} is not increasing at {a} -> {b}")
    if any(e.epoch < 1 or e.start_offset < 0 for e in entries):
        raise ConfigError(f"epoch history in {where} has a non-positive epoch or negative offset")
