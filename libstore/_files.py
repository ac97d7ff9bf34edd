"""Small-file persistence helpers: atomic replace, JSON read and the store's exclusive lock file."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from libstore import durability_hooks
from libstore.errors import StoreIOError, StoreLockedError


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: temp file, fsync, rename, fsync of the folder.

    Readers see the old or the new content, never a mix, even across a crash. Raises StoreIOError.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        raise StoreIOError(f"cannot write {path}: {exc.strerror}") from exc
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """fsync the folder ``path``, so the names created, renamed or deleted in it survive a power
    loss. Fail-stop: raises StoreIOError (a store that cannot make its files durable stops)."""
    try:
        dfd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise StoreIOError(f"cannot fsync the folder {path}: {exc.strerror}") from exc
    if durability_hooks.observer is not None:
        durability_hooks.observer.folder_synced(Path(path))


def read_json(path: Path, what: str) -> Any:
    """The JSON value stored in ``path`` (UTF-8), or None when the file does not exist.

    ``what`` names the file's content in error messages (e.g. "consumer offsets"). Raises
    StoreIOError when the file cannot be read or does not hold valid UTF-8 JSON. A file holding
    JSON ``null`` also reads as None.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreIOError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except ValueError as exc:  # UnicodeDecodeError
        raise StoreIOError(f"{what} {path} is not valid UTF-8: {exc}") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise StoreIOError(f"{what} {path} is not valid JSON: {exc}") from exc


class StoreLock:
    """An exclusive ``flock`` on the store's ``lock`` file: one process per store folder.

    Raises StoreLockedError when another process holds it. Released by :meth:`release` or when
    the process dies (the OS drops the lock, so a SIGKILLed owner never blocks a restart).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._fd)
            self._fd = -1
            raise StoreLockedError(f"store at {self.path.parent} is in use by another process") from exc

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
