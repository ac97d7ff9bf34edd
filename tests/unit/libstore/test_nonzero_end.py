"""quarantine.nonzero_end finds the last non-zero byte of a segment past a position, skipping the
holes the file system reports without reading them, and reading every byte where it cannot."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libstore.mapped_file import MappedFile
from libstore.quarantine import nonzero_end

SIZE = 8 * 1024 * 1024


@pytest.mark.parametrize("seek_data", [True, False])
def test_the_last_non_zero_byte_is_found_with_or_without_seek_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seek_data: bool
) -> None:
    mf = MappedFile.create(tmp_path / f"{0:020d}", SIZE)
    try:
        assert nonzero_end(mf, 0) == 0  # a fresh, pre-allocated segment: all zeros
        for at, data in ((100, b"ab"), (3 * 1024 * 1024 + 7, b"\x01"), (5 * 1024 * 1024, b"zz\x00\x00")):
            os.pwrite(mf.fd, data, at)
        if not seek_data:
            real = os.lseek

            def no_seek_data(fd: int, pos: int, how: int) -> int:
                if how in (os.SEEK_DATA, os.SEEK_HOLE):
                    raise OSError(22, "Invalid argument")
                return real(fd, pos, how)

            monkeypatch.setattr(os, "lseek", no_seek_data)
        assert nonzero_end(mf, 0) == 5 * 1024 * 1024 + 2
        assert nonzero_end(mf, 5 * 1024 * 1024 + 2) == 5 * 1024 * 1024 + 2  # only zeros from there
        assert nonzero_end(mf, 3 * 1024 * 1024 + 8) == 5 * 1024 * 1024 + 2
        mf.buffer[SIZE - 1] = 9  # written through the mapping, not yet flushed
        assert nonzero_end(mf, 0) == SIZE
    finally:
        mf.close()
