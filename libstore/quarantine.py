"""Quarantine: where recovery puts the CommitLog bytes it cuts, instead of deleting them.

Recovery (libstore.recovery) ends the log at the first bytes that are not a valid record. What
lies past that point is usually never-written space (zeros) or the torn last write of a crash,
but when a record in the middle of the log is damaged (a bad sector, a bit flip the body CRC
catches) it is also every later record of every topic. Those are moved aside, not deleted:

    <store root>/quarantine/<yyyyMMdd-HHmmss>-<end offset>/
        <20-digit offset>   bytes of the log from that offset: first the non-zero rest of the
                            segment the log now ends in, then each later segment, whole

Files are named by the CommitLog offset of their first byte (a whole segment keeps its own
name), so the record tools can read them where they parse. Each recovery that cuts non-zero
bytes writes one folder; nothing deletes them (an operator does, once they looked).
:meth:`Quarantine.summary` is what ``mqstore stats`` reports.

A SLAVE gets the same bytes back without anyone's help: its handshake finds its log shorter
than the master's and the master streams everything from the new end.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from libstore._files import fsync_dir
from libstore.errors import StoreIOError
from libstore.mapped_file import MappedFile, offset_to_file_name

log = logging.getLogger(__name__)

QUARANTINE_DIR = "quarantine"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class QuarantineSummary:
    """What the quarantine folder holds: ``events`` recoveries, ``files`` files, ``bytes`` bytes."""

    path: Path
    events: int
    files: int
    bytes: int


def nonzero_end(mf: MappedFile, position: int) -> int:
    """Position just past the last non-zero byte of ``mf`` at or after ``position`` (``position``
    itself when every byte from there is zero). Holes the file system reports (SEEK_DATA /
    SEEK_HOLE: never-written space of a pre-allocated segment, which reads as zeros) are skipped
    unread; where it cannot tell, every byte is read."""
    end = mf.file_size
    last = position
    pos = position
    while pos < end:
        try:
            data = os.lseek(mf.fd, pos, os.SEEK_DATA)
            hole = os.lseek(mf.fd, data, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but holes from ``pos`` on
                break
            data, hole = pos, end  # no SEEK_DATA here: read it all
        if data >= end:
            break
        hole = min(hole, end)
        found = _last_nonzero(mf, data, hole)
        if found > data:
            last = found
        pos = hole
    return last


def _last_nonzero(mf: MappedFile, start: int, stop: int) -> int:
    """Just past the last non-zero byte of ``mf`` in ``[start, stop)``, or ``start``."""
    buf = mf.buffer
    zeros = bytes(_CHUNK)
    end = stop
    while end > start:
        begin = max(start, end - _CHUNK)
        chunk = buf[begin:end]
        if chunk != zeros[: end - begin]:
            return begin + len(chunk.rstrip(b"\0"))
        end = begin
    return start


class Quarantine:
    """The quarantine folder of the store rooted at ``root`` (see module docstring)."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / QUARANTINE_DIR

    def new_event(self, end_offset: int) -> Path:
        """A fresh folder for what a recovery ending the log at ``end_offset`` cuts."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        folder = self.path / f"{stamp}-{end_offset}"
        n = 1
        while folder.exists():
            n += 1
            folder = self.path / f"{stamp}-{end_offset}.{n}"
        try:
            folder.mkdir(parents=True)
        except OSError as exc:
            raise StoreIOError(f"cannot create {folder}: {exc.strerror}") from exc
        fsync_dir(self.path)
        return folder

    @staticmethod
    def keep_bytes(folder: Path, mf: MappedFile, start: int, end: int) -> Path:
        """Copy ``mf``'s bytes ``[start, end)`` into ``folder`` as ``<offset of start>``, durably."""
        path = folder / offset_to_file_name(mf.file_from_offset + start)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(mf.buffer)[start:end]
                try:
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    view.release()
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreIOError(f"cannot write {path}: {exc.strerror}") from exc
        fsync_dir(folder)
        return path

    def summary(self) -> QuarantineSummary:
        """Count what the folder holds (0s when there is none)."""
        events = files = size = 0
        if self.path.is_dir():
            for event in self.path.iterdir():
                if not event.is_dir():
                    continue
                events += 1
                for f in event.iterdir():
                    files += 1
                    size += f.stat().st_size
        return QuarantineSummary(self.path, events, files, size)
