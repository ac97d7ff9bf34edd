"""Durability hooks: where the store's files change and become durable, for fault-injection tests.

A power loss keeps what each file held at its last fdatasync (plus whatever the kernel happened to
write back since), and the names in a folder as of its last fsync. To check that the store never
relies on more, a test installs an :class:`DurabilityObserver` (``observer``) in each of its
processes; the store's file code reports every write, sync, creation, removal and move here, and
the observer keeps, per file, the contents the disk is sure to hold. After killing the processes
the test rewinds the files to that (tests/fault/powerloss.py) and restarts them.

Reported by MappedFile (CommitLog and ConsumeQueue segments), IndexFile, StoreCheckpoint, the
MappedFileQueue's moves to quarantine and the fail-stop folder fsync (libstore._files). Files
replaced with libstore._files.atomic_write are durable when it returns and are not reported.

Without an observer (production) each hook is one global lookup and a None check.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol


class DurabilityObserver(Protocol):
    """What a fault-injection test learns about the store's files (paths are absolute)."""

    def opened(self, path: Path) -> None:
        """An existing file is in use (its current contents are what a restart found)."""

    def created(self, path: Path, size: int) -> None:
        """A new file of ``size`` zero bytes; its name is durable once its folder is synced."""

    def written(self, path: Path, start: int, end: int) -> None:
        """Bytes ``[start, end)`` changed (in the page cache, not yet durable)."""

    def syncing(self, path: Path, start: int = 0, end: int = -1) -> object:
        """An fdatasync of the file is about to start: capture what it will make durable (what
        was written so far; ``[start, end)``, ``end`` -1 for the whole file, is a range known to
        have changed besides what :meth:`written` reported). Returns a token for :meth:`synced`."""

    def synced(self, token: object) -> None:
        """That fdatasync completed: what :meth:`syncing` captured is durable (writes made while
        it ran may or may not be)."""

    def removed(self, path: Path) -> None:
        """The file was unlinked; gone for good once its folder is synced."""

    def moved(self, src: Path, dst: Path) -> None:
        """The file was renamed (both folders are synced right after)."""

    def folder_synced(self, folder: Path) -> None:
        """An fsync of the folder completed: its names (created, removed) are durable."""


observer: DurabilityObserver | None = None


def fdatasync(fd: int, path: Path, start: int = 0, end: int = -1) -> None:
    """``os.fdatasync(fd)`` of the file at ``path``, reported to the observer (``[start, end)`` as
    for :meth:`DurabilityObserver.syncing`). Raises OSError."""
    obs = observer
    if obs is None:
        os.fdatasync(fd)
        return
    token = obs.syncing(path, start, end)
    os.fdatasync(fd)
    obs.synced(token)


def install(new: DurabilityObserver | None) -> None:
    """Make ``new`` the process's observer (None removes it)."""
    global observer
    observer = new
