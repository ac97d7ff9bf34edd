"""Simulated power loss: a durability recorder for the store's processes, and the rewind.

LazyFS (a FUSE layer that drops unsynced writes) is not packaged for Debian or PyPI, so the
loss is simulated one level up, at the store's own file code (libstore.durability_hooks):

* :class:`DurabilityRecorder`, installed in each process of a member (tests/fault/serve.py),
  keeps a *shadow* of every file the store reports: the contents the disk is sure to hold. Each
  write marks its range dirty; each fdatasync captures the dirty ranges (and the range the
  caller names) as the file holds them when it starts, and copies them into the shadow once it
  returns (what is written meanwhile stays dirty); a new file's name, or a removal, counts once
  its folder is fsynced. The shadows live under the member's shadow folder, so they outlive the processes.
* :func:`lose_power`, run by the test after SIGKILLing every process of a member, rewinds the
  member's files: each 512-byte sector that differs from the shadow keeps the new bytes (the
  kernel wrote them back before the loss) or goes back to the durable ones, at random; a sector
  that never held durable data (zeros in the shadow) may instead hold garbage (a torn write past
  the durable end). Names created but never synced disappear; removals never synced come back.
  The shadows then become what the files hold: after the reboot that is the disk.

Files replaced with atomic_write are durable when written and are not tracked; nor are files the
store never reported (they keep what they hold).

A slow disk: while the shadow folder holds ``slow-sync-ms`` (a number), every fdatasync of a
CommitLog segment takes that much longer before it counts (the recorder sleeps before copying to
the shadow, and the store's flush returns only then), so a power loss lands among written,
replicated and not yet durable records far more often than a fast disk allows.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

PAGE = 4096
SECTOR = 512
_BLOCK = 1 << 16
PENDING_CREATE = ".pending-create"
PENDING_REMOVE = ".pending-remove"
SLOW_SYNC_FILE = "slow-sync-ms"


class DurabilityRecorder:
    """libstore.durability_hooks.DurabilityObserver keeping shadows of the files under
    ``data_root`` in ``shadow_root`` (same relative paths)."""

    def __init__(self, data_root: Path, shadow_root: Path) -> None:
        self.data_root = Path(data_root).resolve()
        self.shadow_root = Path(shadow_root).resolve()
        self._lock = threading.Lock()
        self._dirty: dict[Path, list[tuple[int, int]]] = {}
        self._slow = (0.0, 0)  # (when read, ms)

    def _shadow(self, path: Path) -> Path | None:
        try:
            rel = Path(os.path.abspath(path)).relative_to(self.data_root)
        except ValueError:
            return None
        return self.shadow_root / rel

    # -- the hooks ----------------------------------------------------------------------------------
    def opened(self, path: Path) -> None:
        shadow = self._shadow(path)
        if shadow is None:
            return
        with self._lock:
            if not shadow.exists():
                shadow.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, shadow)  # found at start: what the disk holds
                return
            # A shadow from an earlier life of the process: pages that differ were written
            # then and are still not durable; an fdatasync now would make them so.
            self._dirty[Path(path)] = _differing_ranges(Path(path), shadow)

    def created(self, path: Path, size: int) -> None:
        shadow = self._shadow(path)
        if shadow is None:
            return
        with self._lock:
            shadow.parent.mkdir(parents=True, exist_ok=True)
            with open(shadow, "wb") as fh:
                fh.truncate(size)
            _marker(shadow, PENDING_REMOVE).unlink(missing_ok=True)
            _marker(shadow, PENDING_CREATE).touch()
            self._dirty.pop(Path(path), None)

    def written(self, path: Path, start: int, end: int) -> None:
        if end <= start or self._shadow(path) is None:
            return
        with self._lock:
            self._dirty.setdefault(Path(path), []).append((start, end))

    def _slow_sync_ms(self) -> int:
        read_at, ms = self._slow
        now = time.monotonic()
        if now - read_at > 0.1:
            try:
                ms = int((self.shadow_root / SLOW_SYNC_FILE).read_text() or 0)
            except (OSError, ValueError):
                ms = 0
            self._slow = (now, ms)
        return ms

    def syncing(self, path: Path, start: int = 0, end: int = -1) -> object:
        """Capture, before the fdatasync starts, the bytes it will make durable: what was written
        so far (writes made while it runs stay dirty for the next one)."""
        shadow = self._shadow(path)
        if shadow is None:
            return None
        with self._lock:
            ranges = self._dirty.pop(Path(path), [])
            size = os.path.getsize(path)
            if end < 0:
                end = size
            if end > start:
                ranges.append((start, end))
            if not shadow.exists():  # a file the recorder had not seen: all of it counts now
                ranges = [(0, size)]
            with open(path, "rb") as src:
                captured = []
                for a, b in _merge(ranges):
                    src.seek(a)
                    captured.append((a, src.read(b - a)))
        return (path, shadow, captured)

    def synced(self, token: object) -> None:
        if token is None:
            return
        path, shadow, captured = cast("tuple[Path, Path, list[tuple[int, bytes]]]", token)
        if path.parent.name == "commitlog" and (delay := self._slow_sync_ms()):
            time.sleep(delay / 1000)  # a slow disk: durable only once this returns
        with self._lock:
            if not shadow.exists():
                shadow.parent.mkdir(parents=True, exist_ok=True)
                shadow.touch()
            with open(shadow, "r+b") as dst:
                for a, data in captured:
                    dst.seek(a)
                    dst.write(data)

    def removed(self, path: Path) -> None:
        shadow = self._shadow(path)
        if shadow is None:
            return
        with self._lock:
            self._dirty.pop(Path(path), None)
            if shadow.exists():
                if _marker(shadow, PENDING_CREATE).exists():  # never durable: nothing comes back
                    shadow.unlink()
                    _marker(shadow, PENDING_CREATE).unlink()
                else:
                    _marker(shadow, PENDING_REMOVE).touch()

    def moved(self, src: Path, dst: Path) -> None:
        a, b = self._shadow(src), self._shadow(dst)
        if a is None or b is None:
            return
        with self._lock:
            self._dirty.pop(Path(src), None)
            if a.exists():
                b.parent.mkdir(parents=True, exist_ok=True)
                os.replace(a, b)

    def folder_synced(self, folder: Path) -> None:
        shadow_dir = self._shadow(folder)
        if shadow_dir is None or not shadow_dir.is_dir():
            return
        with self._lock:
            for marker in shadow_dir.glob("*" + PENDING_CREATE):
                marker.unlink(missing_ok=True)
            for marker in shadow_dir.glob("*" + PENDING_REMOVE):
                Path(str(marker)[: -len(PENDING_REMOVE)]).unlink(missing_ok=True)
                marker.unlink(missing_ok=True)


@dataclass
class PowerLossReport:
    """What :func:`lose_power` did to a member's files."""

    files: int = 0
    sectors_new: int = 0
    sectors_old: int = 0
    sectors_garbage: int = 0
    names_lost: list[str] = field(default_factory=list)
    names_back: list[str] = field(default_factory=list)


def lose_power(data_root: Path, shadow_root: Path, rng: random.Random) -> PowerLossReport:
    """Rewind every tracked file under ``data_root`` as a power loss would (see module
    docstring). Every process writing there must be dead."""
    data_root, shadow_root = Path(data_root), Path(shadow_root)
    report = PowerLossReport()
    if not shadow_root.exists():
        return report
    for shadow in sorted(p for p in shadow_root.rglob("*") if p.is_file()):
        if shadow.name.endswith((PENDING_CREATE, PENDING_REMOVE)):
            continue
        target = data_root / shadow.relative_to(shadow_root)
        if _marker(shadow, PENDING_CREATE).exists():
            target.unlink(missing_ok=True)
            shadow.unlink()
            _marker(shadow, PENDING_CREATE).unlink()
            report.names_lost.append(str(target.relative_to(data_root)))
            continue
        if _marker(shadow, PENDING_REMOVE).exists() or not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shadow, target)
            _marker(shadow, PENDING_REMOVE).unlink(missing_ok=True)
            report.names_back.append(str(target.relative_to(data_root)))
            continue
        report.files += 1
        _rewind(target, shadow, rng, report)
        shutil.copyfile(target, shadow)  # what the disk holds after the reboot
    return report


def _rewind(target: Path, shadow: Path, rng: random.Random, report: PowerLossReport) -> None:
    with open(target, "r+b") as fh, open(shadow, "rb") as old_fh:
        for start, end in _differing_ranges(target, shadow):
            fh.seek(start)
            new = fh.read(end - start)
            old_fh.seek(start)
            old = old_fh.read(len(new)).ljust(len(new), b"\0")
            out = bytearray(new)
            for s in range(0, len(new), SECTOR):
                a, b = new[s : s + SECTOR], old[s : s + SECTOR]
                if a == b:
                    continue
                roll = rng.random()
                if roll < 0.1 and not any(b):
                    out[s : s + len(a)] = rng.randbytes(len(a))
                    report.sectors_garbage += 1
                elif roll < 0.55:
                    out[s : s + len(a)] = b
                    report.sectors_old += 1
                else:
                    report.sectors_new += 1
            fh.seek(start)
            fh.write(out)
        fh.flush()
        os.fsync(fh.fileno())


def _differing_ranges(a: Path, b: Path) -> list[tuple[int, int]]:
    """Page-aligned ranges where the two files differ (a missing tail counts as zeros)."""
    out: list[tuple[int, int]] = []
    with open(a, "rb") as fa, open(b, "rb") as fb:
        pos = 0
        while True:
            x = fa.read(_BLOCK)
            y = fb.read(_BLOCK)
            if not x and not y:
                break
            if x != y:
                n = max(len(x), len(y))
                x, y = x.ljust(n, b"\0"), y.ljust(n, b"\0")
                for p in range(0, n, PAGE):
                    if x[p : p + PAGE] != y[p : p + PAGE]:
                        out.append((pos + p, pos + min(p + PAGE, n)))
            pos += _BLOCK
    return _merge(out)


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _marker(shadow: Path, suffix: str) -> Path:
    return shadow.with_name(shadow.name + suffix)
