"""CleanCommitLogService: frees disk from the head of the CommitLog (spec §9).

Every ``cleanResourceInterval`` (10 s; the first a minute after start, as RocketMQ) one round:

1. measures the disk usage of the CommitLog's partition (a fraction; ``disk_usage`` is
   injectable, default :func:`disk_usage_ratio`);
2. above ``diskSpaceWarningLevelRatio`` (90%) marks the store disk-full: puts are refused with
   DiskFullError (RESOURCE_EXHAUSTED, reason DISK_FULL) until a round measures below it again;
3. scans what the segment summaries miss (libstore.segment_summary), oldest first, at most two
   segments' worth per round and not at all under disk pressure, and takes the retention
   settings of the moment (libstore.retention_policy);
4. deletes, oldest first, segments whose messages have all expired: at once when per-topic
   settings alone decide that (``retentionHours``, deleted topics), else, as RocketMQ, when the
   local hour is one of ``deleteWhen`` ("04") or usage is above ``diskMaxUsedSpaceRatio`` (75%)
   (messages of topics without ``retentionHours`` expire ``fileReservedTime``, 72 h, after their
   segment's last modification, as in RocketMQ). Above ``diskSpaceCleanForciblyRatio`` (85%, or
   the warning level) with ``cleanFileForciblyEnable`` it deletes unexpired segments too, oldest
   first, whatever their topics ask. Never the newest segment, never unflushed bytes, at most
   ``deleteFileBatchMax`` (10) per round, ``deleteCommitLogFilesInterval`` (100 ms) apart; then
   it saves the changed summaries and drops tombstones the log no longer reaches.

Derived state follows the log's new min offset on its own (ConsumeQueues, IndexFiles). A
replica cleans by its own clock and usage; a SLAVE is never refused (it takes no puts).

``hold`` (set by the embedded suite to its timer's) gives the lowest CommitLog offset that must
stay: delayed messages wait in the log until they are due, so expiry never deletes a segment
holding one that is still undelivered. Disk pressure (the forcible ratio) overrides it, as it
overrides expiry.

Only the head of the log is deleted: a segment that has expired behind one that has not waits
for it. Offsets are positions in one log, so freeing the middle would mean copying the live
records elsewhere (compaction) and renumbering them, which the consume queues, the replicas and
every client's offsets depend on; see the README's retention section.

What RocketMQ leaves out and we keep: every round's outcome (:class:`CleanupRound`, the last one
in :attr:`CleanCommitLogService.last_round`) and running totals, for stats and metrics.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from libstore.config import StoreConfig
from libstore.errors import StoreIOError
from libstore.mapped_file_queue import MappedFileQueue
from libstore.service_thread import ServiceThread

if TYPE_CHECKING:
    from libstore.commit_log import CommitLog
    from libstore.mapped_file import MappedFile

log = logging.getLogger(__name__)

FIRST_ROUND_DELAY_S = 60.0  # RocketMQ schedules the first cleanup a minute after start


def used_share(usage: tuple[int, int, int]) -> float:
    """Used share (0..1) of a ``shutil.disk_usage`` result (total, used, free bytes), as ``df``
    computes Use%: used / (used + available to unprivileged users), so blocks reserved for root
    are left out of both."""
    _, used, free = usage
    return used / (used + free) if used + free else 0.0


def disk_usage_ratio(path: Path) -> float:
    """:func:`used_share` of the file system holding ``path``. Raises OSError."""
    return used_share(shutil.disk_usage(path))


@dataclass(frozen=True)
class CleanupRound:
    """One round's outcome: when (ms since the epoch), the disk usage measured (0..1), why it
    deleted ("topic retention" when per-topic settings alone did; "" when nothing expired by
    ``fileReservedTime`` could go: not the hour, usage low), the segments deleted (file name,
    bytes) and the log's min offset after it."""

    at_ms: int
    usage: float
    reason: str
    deleted: tuple[tuple[str, int], ...]
    min_offset: int

    @property
    def deleted_bytes(self) -> int:
        return sum(size for _, size in self.deleted)


class CleanCommitLogService(ServiceThread):
    """The cleanup rounds of one CommitLog (module docstring). ``clock`` (seconds since the
    epoch), ``local_hour`` (0-23) and ``disk_usage`` (path -> 0..1) are injectable for tests;
    :meth:`clean_once` runs one round in the caller's thread."""

    def __init__(
        self,
        log_: CommitLog,
        config: StoreConfig,
        *,
        clock: Callable[[], float] = time.time,
        local_hour: Callable[[], int] | None = None,
        disk_usage: Callable[[Path], float] = disk_usage_ratio,
    ) -> None:
        super().__init__("CleanCommitLogService")
        self.log = log_
        self.config = config
        self._clock = clock
        self._local_hour = local_hour or (lambda: time.localtime(self._clock()).tm_hour)
        self._disk_usage = disk_usage
        self.last_round: CleanupRound | None = None
        # The lowest CommitLog offset expiry must keep (None: no bound); see the module docstring.
        self.hold: Callable[[], int | None] | None = None
        self.deleted_files = 0
        self.deleted_bytes = 0
        self._started_rounds = False

    def run_loop(self) -> None:
        first, self._started_rounds = not self._started_rounds, True
        self.wait_for_running(FIRST_ROUND_DELAY_S * 1000 if first else self.config.clean_resource_interval)
        if self.stopped:
            return
        try:
            self.clean_once()
        except (OSError, StoreIOError) as exc:
            log.error(
                "CommitLog cleanup failed, next round in %d ms: %s", self.config.clean_resource_interval, exc
            )

    def clean_once(self) -> CleanupRound:
        """One round (module docstring). Raises OSError when usage cannot be measured,
        StoreIOError when a segment cannot be deleted (the next round tries again)."""
        cfg = self.config
        usage = self._disk_usage(cfg.commit_log_dir)
        percent = usage * 100.0
        if percent > cfg.disk_space_warning_level_ratio:
            self.log.set_disk_full(
                f"the disk holding the CommitLog is {percent:.1f}% used, above diskSpaceWarningLevelRatio "
                f"({cfg.disk_space_warning_level_ratio}%): puts are refused until cleanup frees space"
            )
        elif self.log.disk_full:
            self.log.set_disk_full("")
        forced = cfg.clean_file_forcibly_enable and percent > cfg.disk_space_clean_forcibly_ratio
        if forced:
            limit = cfg.disk_space_clean_forcibly_ratio
            reason = f"disk {percent:.1f}% used > diskSpaceCleanForciblyRatio {limit}%"
        elif percent > cfg.disk_max_used_space_ratio:
            reason = f"disk {percent:.1f}% used > diskMaxUsedSpaceRatio {cfg.disk_max_used_space_ratio}%"
        elif (hour := self._local_hour()) in cfg.delete_hours:
            reason = f"deleteWhen hour {hour:02d}"
        else:
            reason = ""
        if not forced:  # disk pressure deletes without asking the summaries: no time for scans
            # At most two segments' worth per round: after an upgrade every segment is a gap,
            # and the oldest (the next to go) come first.
            self.log.refresh_summaries(2 * cfg.mapped_file_size_commit_log)
        by_round: set[int] = set()  # segments (first offsets) that only the round's reason let go
        doomed = self._doomed(reason, forced, self.hold() if self.hold is not None else None, by_round)
        pause_s = cfg.delete_commit_log_files_interval / 1000.0
        deleted = self.log.delete_head_segments(
            doomed, batch_max=cfg.delete_file_batch_max, pause=lambda: not self._stopped.wait(pause_s)
        )
        if deleted and not by_round.intersection(
            MappedFileQueue.parse_file_name(name) for name, _ in deleted
        ):
            reason = "topic retention"  # whatever the hour or the disk: per-topic settings decided
        self.log.summaries.save_dirty()
        self.log.topic_config.forget_tombstones_below(self.log.min_offset)
        result = CleanupRound(int(self._clock() * 1000), usage, reason, tuple(deleted), self.log.min_offset)
        if deleted:
            self.deleted_files += len(deleted)
            self.deleted_bytes += result.deleted_bytes
            log.info(
                "CommitLog cleanup (%s): deleted %d segment(s), %d bytes; min offset now %d",
                reason,
                len(deleted),
                result.deleted_bytes,
                result.min_offset,
            )
        self.last_round = result
        return result

    def _doomed(
        self, reason: str, forced: bool, keep_from: int | None, by_round: set[int]
    ) -> Callable[[MappedFile], str]:
        """The per-segment test of one round (module docstring, step 4). Adds to ``by_round``
        the first offset of each segment it dooms for the round's reason (the hour, the disk)
        rather than for per-topic settings alone."""
        policy = self.log.retention_policy()
        now_ms = int(self._clock() * 1000)
        summaries = self.log.summaries

        def doomed(mf: MappedFile) -> str:
            if not forced and keep_from is not None and mf.file_from_offset + mf.file_size > keep_from:
                return ""
            try:
                modified_ms = int(os.stat(mf.path).st_mtime * 1000)
            except FileNotFoundError:
                modified_ms = 0
            except OSError as exc:
                raise StoreIOError(f"cannot stat {mf.path}: {exc.strerror}") from exc
            expires_at, explicit = policy.segment_expiry(summaries.get(mf.file_from_offset), modified_ms)
            if expires_at <= now_ms and explicit:
                return "every message in it has expired"
            if expires_at <= now_ms and reason:
                by_round.add(mf.file_from_offset)
                return f"every message in it has expired ({reason})"
            if forced:
                by_round.add(mf.file_from_offset)
                return "disk usage forces it"
            return ""

        return doomed
