"""Shared fixtures: small-segment store configs in a fresh temporary folder."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from libstore import CommitLog, StoreConfig

SEGMENT = 256 * 1024  # small CommitLog segments so tests roll files quickly
_ROOT = Path(__file__).parent
_MARK_BY_DIR = {"crash": "crash", "fault": "crash", "spark": "spark", "k8s": "k8s"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of a directory that is all one kind (markers in pyproject.toml)."""
    for item in items:
        parts = item.path.relative_to(_ROOT).parts if item.path.is_relative_to(_ROOT) else ()
        mark = _MARK_BY_DIR.get(parts[0]) if len(parts) > 1 else None
        if mark is not None:
            item.add_marker(mark)


def small_store_config(root: Path, **overrides: object) -> StoreConfig:
    """A store under ``root``: small segments, no preload, disk ratios out of the way
    (``overrides``: StoreConfig fields)."""
    return StoreConfig(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=SEGMENT,
        max_message_size=64 * 1024,
        preload_mapped_file_enable=False,
        # Retention by disk usage has its own tests (an injected usage): the rest must not
        # depend on how full the host's disk is.
        disk_max_used_space_ratio=99,
        disk_space_clean_forcibly_ratio=99,
        disk_space_warning_level_ratio=99,
    ).replace(**overrides)


@pytest.fixture
def store_config(tmp_path: Path) -> StoreConfig:
    return small_store_config(tmp_path / "store")


@pytest.fixture
def open_log(store_config: StoreConfig) -> Iterator[Callable[..., CommitLog]]:
    """Open CommitLogs (config overrides as keyword arguments); all are shut down at the end."""
    opened: list[CommitLog] = []

    def _open(**overrides: object) -> CommitLog:
        cl = CommitLog.open(store_config.replace(**overrides) if overrides else store_config)
        opened.append(cl)
        return cl

    yield _open
    for cl in opened:
        cl.shutdown()
