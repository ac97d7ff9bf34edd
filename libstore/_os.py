"""Thin wrappers over OS calls Python's stdlib lacks or hides: mlock/munlock, hole punching,
block pre-allocation. Each degrades quietly where the OS or filesystem does not allow it and
reports whether it worked.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import mmap
import os

log = logging.getLogger(__name__)

_libc: ctypes.CDLL | None
try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    _libc.mlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    _libc.munlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    _libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong)
except (OSError, AttributeError):  # pragma: no cover - non-glibc systems
    _libc = None

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
_ZEROS = bytes(1 << 20)


def mmap_address(mm: mmap.mmap) -> int:
    """Start address of a writable mapping (the temporary buffer export is released at once)."""
    holder = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(holder)
    finally:
        del holder


def mlock(address: int, length: int) -> bool:
    """Lock ``length`` bytes at ``address`` in RAM; False (quietly) when not permitted."""
    if _libc is None or length <= 0:
        return False
    if _libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(length)) != 0:
        log.debug("mlock of %d bytes refused: %s", length, os.strerror(ctypes.get_errno()))
        return False
    return True


def munlock(address: int, length: int) -> bool:
    if _libc is None or length <= 0:
        return False
    return int(_libc.munlock(ctypes.c_void_p(address), ctypes.c_size_t(length))) == 0


def madvise(mm: mmap.mmap, advice: int) -> bool:
    """madvise over the whole mapping; False when the OS refuses."""
    try:
        mm.madvise(advice)
    except (OSError, ValueError):
        return False
    return True


def allocate_blocks(fd: int, length: int) -> bool:
    """Give the file ``length`` bytes of allocated blocks (posix_fallocate), else just the size.
    True when the blocks were allocated; False when the filesystem cannot (the file is then
    sparse: a store through a mapping may meet a full disk as SIGBUS).

    Allocated blocks mean a later store through a shared mapping cannot hit ENOSPC (SIGBUS).
    Raises OSError(ENOSPC/EFBIG/EDQUOT...) when the space is not there.
    """
    try:
        os.posix_fallocate(fd, 0, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, length)
        return False
    return True


def blocks_allocated(fd: int, length: int) -> bool:
    """True when the file holds at least ``length`` bytes of allocated blocks (st_blocks: no
    hole for a store through a mapping to fill). Raises OSError."""
    return os.fstat(fd).st_blocks * 512 >= length


def zero_range(fd: int, start: int, length: int) -> bool:
    """Make ``[start, start+length)`` of the file read as zeros and keep its blocks allocated.
    False when they could not be (released pages that the filesystem would not allocate again:
    a hole is left there).

    Whole pages are released with FALLOC_FL_PUNCH_HOLE and re-allocated; partial pages (and
    everything, where hole punching is unsupported) are overwritten with zeros via pwrite.
    """
    if length <= 0:
        return True
    end = start + length
    page = mmap.PAGESIZE
    first_full = -(-start // page) * page
    last_full = end // page * page
    if _libc is not None and last_full - first_full >= page:
        rc = _libc.fallocate(
            fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, first_full, last_full - first_full
        )
        if rc == 0:
            allocated = True
            try:
                os.posix_fallocate(fd, first_full, last_full - first_full)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                allocated = False
            _pwrite_zeros(fd, start, first_full - start)
            _pwrite_zeros(fd, last_full, end - last_full)
            return allocated
    _pwrite_zeros(fd, start, length)
    return True


def _pwrite_zeros(fd: int, start: int, length: int) -> None:
    pos = start
    end = start + length
    while pos < end:
        n = min(len(_ZEROS), end - pos)
        written = os.pwrite(fd, memoryview(_ZEROS)[:n], pos)
        pos += written


def write_zeros(fd: int, start: int, length: int) -> None:
    """Overwrite ``[start, start+length)`` with zeros through the page cache (GIL released per MiB)."""
    _pwrite_zeros(fd, start, length)


def read_through(fd: int, start: int, length: int, chunk: int = 1 << 20) -> None:
    """Read the range so its pages sit in the page cache (GIL released per chunk)."""
    pos = start
    end = start + length
    while pos < end:
        got = os.pread(fd, min(chunk, end - pos), pos)
        if not got:
            return
        pos += len(got)


def physical_memory() -> int:
    """Bytes of RAM (RocketMQ's in-memory estimates are a share of it, accessMessageInMemoryMaxRatio);
    8 GiB when the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * 1024**3


M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3


def mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt(param, value)`` (M_TRIM_THRESHOLD, M_MMAP_THRESHOLD: bytes); False
    (quietly) where the C library has none (musl) or refuses the value."""
    if _libc is None:
        return False
    try:
        fn = _libc.mallopt
    except AttributeError:  # pragma: no cover - a C library without mallopt
        return False
    fn.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(fn(param, value))
