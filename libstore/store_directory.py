"""StoreDirectory: a store folder owned by one process (the CommitLog's root, a dispatch or index
service's root): the exclusive ``lock`` file and the ``abort`` marker.

``last_exit_ok`` is False when the marker was found at open (the owner crashed): derived files
written after their last checkpoint may then be torn, and recovery distrusts them.
"""

from __future__ import annotations

from pathlib import Path

from libstore import durability_hooks
from libstore._files import StoreLock, fsync_dir
from libstore.errors import StoreIOError
from libstore.store_paths import abort_path, lock_path


class StoreDirectory:
    """Lock ``root`` (StoreLockedError if another process holds it) and read the abort marker."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = StoreLock(lock_path(self.root))
        self.last_exit_ok = not abort_path(self.root).exists()

    def mark_running(self) -> None:
        """Create the abort marker, durably (the folder is fsynced): from now on an exit
        without :meth:`mark_clean` is a crash, a power loss included. Raises StoreIOError."""
        try:
            abort_path(self.root).touch()
        except OSError as exc:
            raise StoreIOError(f"cannot create {abort_path(self.root)}: {exc.strerror}") from exc
        if durability_hooks.observer is not None:
            durability_hooks.observer.created(abort_path(self.root), 0)
        fsync_dir(self.root)

    def mark_clean(self) -> None:
        """Remove the abort marker (after a complete, flushed shutdown), durably. Raises StoreIOError."""
        try:
            abort_path(self.root).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreIOError(f"cannot remove {abort_path(self.root)}: {exc.strerror}") from exc
        if durability_hooks.observer is not None:
            durability_hooks.observer.removed(abort_path(self.root))
        fsync_dir(self.root)

    def release(self) -> None:
        self._lock.release()
