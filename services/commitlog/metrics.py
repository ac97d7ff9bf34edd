"""The commitlog service's metrics (the embedded suite's too), per process.

Puts, per topic: ``mqstore.put.messages`` and ``mqstore.put.bytes`` (appended, replays of the
de-duplication window included), ``mqstore.put.failures`` (messages answered anything but PUT_OK,
by status), ``mqstore_put_latency_milliseconds`` (from the call's start to its answer: the flush
and slave waits included). Waits: ``mqstore_flush_wait_milliseconds`` (SYNC_FLUSH group commit,
by status) and ``mqstore.ha.sync_master_wait`` (SYNC_MASTER, by status). The latency histograms
named in Prometheus form are scrape-only (services._common.metrics). The store, per broker group member:
its offsets (``mqstore.commitlog.{min,max,confirm,flushed}_offset``, bytes), the bytes it holds
(``mqstore.commitlog.size``), the share of its disk in use (``mqstore.disk.used_ratio``), whether
it takes puts (``mqstore.commitlog.writeable``: running, master, no I/O error, disk not full)
and its role (``mqstore.commitlog.role`` = 1 with the role as attribute); retention's deletions
(``mqstore.retention.*``).
"""

from __future__ import annotations

import shutil
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from opentelemetry.metrics import Observation

from libstore import CommitLog, PutMessageResults, PutMessageStatus
from libstore.commit_log_cleaner import used_share
from services._common.metrics import KeyedCounts, latency_histogram, observer, register_once, wait_histogram
from services._common.telemetry import meter

if TYPE_CHECKING:
    from services.commitlog.local import LocalCommitLog

METER = "mqstore.commitlog"
_OK = PutMessageStatus.PUT_OK

# The ports of this process, read by the observable instruments when something collects.
LIVE: weakref.WeakSet[LocalCommitLog] = weakref.WeakSet()


class PutMetrics:
    """What one port's puts add to the process's metrics (see module docstring)."""

    def __init__(self) -> None:
        self.messages = KeyedCounts("topic")
        self.bytes = KeyedCounts("topic")
        self.failures = KeyedCounts("topic", "status")
        self._latency = latency_histogram(
            "mqstore_put_latency_milliseconds", "time a put call took, waits included", "topic"
        )
        self.flush_wait = latency_histogram(
            "mqstore_flush_wait_milliseconds", "SYNC_FLUSH: time a put waited for the disk", "status"
        )
        self.sync_master_wait = wait_histogram(
            METER, "mqstore.ha.sync_master_wait", "SYNC_MASTER: time a put waited for slaves"
        )

    def record(self, topics: Sequence[str], results: PutMessageResults, started: float) -> None:
        """A put of messages to ``topics`` (one per result, in order) answered ``results``;
        ``started``: its ``time.perf_counter()`` at the start."""
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        n = len(results)
        if not n:
            return
        appended = results.appended
        sizes = results.sizes
        first = topics[0]
        if n == 1 or topics.count(first) == n:  # one topic: the common batch
            if appended:
                self.messages.add((first,), appended)
                self.bytes.add((first,), sum(sizes[:appended]) if appended > 1 else sizes[0])
            self._latency.record(elapsed_ms, (first,))
        else:
            for i in range(appended):
                self.messages.add((topics[i],), 1)
                self.bytes.add((topics[i],), sizes[i])
            for topic in set(topics):
                self._latency.record(elapsed_ms, (topic,))
        if appended < n or (results.status is not _OK and len(results.unwaited) < n):
            for i, result in enumerate(results):
                if result.status is not _OK:
                    self.failures.add((topics[i], result.status.name), 1)


def _member(log: CommitLog) -> dict[str, str | int]:
    return {"broker_name": log.config.broker_name, "broker_id": log.config.broker_id}


def _per_log(value: Callable[[CommitLog], float]) -> Callable[[LocalCommitLog], list[Observation]]:
    def observe(port: LocalCommitLog) -> list[Observation]:
        log = port.log
        if not log.running:  # a closed store reports nothing
            return []
        return [Observation(value(log), _member(log))]

    return observe


def _puts(counts: Callable[[PutMetrics], KeyedCounts]) -> Callable[[LocalCommitLog], list[Observation]]:
    def observe(port: LocalCommitLog) -> list[Observation]:
        log = port.log
        return counts(port.put_metrics).observations(_member(log)) if log.running else []

    return observe


def _role(port: LocalCommitLog) -> list[Observation]:
    log = port.log
    return [Observation(1, {**_member(log), "role": log.broker_role.value})] if log.running else []


def _register() -> None:
    m = meter(METER)
    m.create_observable_counter(
        "mqstore.put.messages", [observer(LIVE, _puts(lambda p: p.messages))], description="messages appended"
    )
    m.create_observable_counter(
        "mqstore.put.bytes",
        [observer(LIVE, _puts(lambda p: p.bytes))],
        unit="By",
        description="bytes appended",
    )
    m.create_observable_counter(
        "mqstore.put.failures",
        [observer(LIVE, _puts(lambda p: p.failures))],
        description="messages answered anything but PUT_OK, by status",
    )
    offsets: list[tuple[str, Callable[[CommitLog], float], str]] = [
        ("min_offset", lambda log: log.min_offset, "first byte of the log still held"),
        ("max_offset", lambda log: log.max_offset, "end of the log (bytes written)"),
        ("confirm_offset", lambda log: log.confirm_offset, "end of what consumers may see"),
        ("flushed_offset", lambda log: log.flushed_offset, "end of what is on disk"),
        ("size", lambda log: log.max_offset - log.min_offset, "bytes of log held"),
    ]
    for name, value, description in offsets:
        m.create_observable_gauge(
            f"mqstore.commitlog.{name}", [observer(LIVE, _per_log(value))], unit="By", description=description
        )
    held: list[tuple[str, Callable[[CommitLog], float], str, str]] = [
        (
            "memory",
            lambda log: log.transient.memory_bytes,
            "By",
            "record bytes of transient messages in memory",
        ),
        (
            "scratch",
            lambda log: log.transient.scratch_bytes,
            "By",
            "scratch file bytes they were paged out to",
        ),
        ("messages", lambda log: len(log.transient), "", "transient messages held, in memory or paged out"),
    ]
    for name, value, unit, description in held:
        m.create_observable_gauge(
            f"mqstore.transient.{name}", [observer(LIVE, _per_log(value))], unit=unit, description=description
        )
    m.create_observable_counter(
        "mqstore.transient.refused",
        [observer(LIVE, _per_log(lambda log: log.transient.refused))],
        description="transient puts refused with SYSTEM_BUSY: neither memory nor scratch had room",
    )
    m.create_observable_gauge(
        "mqstore.disk.used_ratio",
        [observer(LIVE, _per_log(lambda log: used_share(shutil.disk_usage(log.config.commit_log_dir))))],
        description="share of the CommitLog's file system in use, 0..1",
    )
    m.create_observable_gauge(
        "mqstore.commitlog.writeable",
        [
            observer(
                LIVE,
                _per_log(
                    lambda log: int(log.writeable and not log.disk_full and log.broker_role.value != "SLAVE")
                ),
            )
        ],
        description="1 while the store takes puts (a running master, no I/O error, disk not full)",
    )
    m.create_observable_gauge(
        "mqstore.commitlog.role", [observer(LIVE, _role)], description="1, with the broker role as attribute"
    )
    m.create_observable_counter(
        "mqstore.retention.deleted_segments",
        [observer(LIVE, _per_log(lambda log: log.cleaner.deleted_files if log.cleaner is not None else 0))],
        description="CommitLog segments retention deleted since the start",
    )
    m.create_observable_counter(
        "mqstore.retention.deleted_bytes",
        [observer(LIVE, _per_log(lambda log: log.cleaner.deleted_bytes if log.cleaner is not None else 0))],
        unit="By",
        description="CommitLog bytes retention deleted since the start",
    )
    m.create_observable_gauge(
        "mqstore.retention.disk_full",
        [observer(LIVE, _per_log(lambda log: 1 if log.disk_full else 0))],
        description="1 while puts are refused because the disk is past diskSpaceWarningLevelRatio",
    )


def track(port: LocalCommitLog) -> PutMetrics:
    """Count ``port`` in the process's metrics (its instruments are registered on first use)."""
    register_once(METER, _register)
    LIVE.add(port)
    return PutMetrics()
