"""QueueOffsetTable's snapshots (libstore.queue_offset_table): written when they say something
new, and only then."""

from __future__ import annotations

from pathlib import Path

import pytest

from libstore import queue_offset_table
from libstore.log_generation import LogGeneration
from libstore.queue_offset_table import QueueOffsetTable

_WRITTEN: list[int] = []


@pytest.fixture(autouse=True)
def _count_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    real = queue_offset_table.save_snapshot

    def counted(path: Path, snapshot: queue_offset_table.QueueOffsetSnapshot) -> None:
        _WRITTEN.append(snapshot.phy_offset)
        real(path, snapshot)

    _WRITTEN.clear()
    monkeypatch.setattr(queue_offset_table, "save_snapshot", counted)


def _writes(table: QueueOffsetTable, gen: LogGeneration, phy_offset: int) -> bool:
    """Save a snapshot of ``table`` at ``phy_offset``; whether the file was written."""
    before = len(_WRITTEN)
    table.save(table.snapshot_at(phy_offset, gen), gen)
    return len(_WRITTEN) > before


def test_an_unchanged_table_is_not_written_again(tmp_path: Path) -> None:
    gen = LogGeneration(tmp_path / "generation.json")
    table = QueueOffsetTable(tmp_path / "queueOffsetTable.json")
    table.replace({("T", 0): 5, ("T", 1): 3}, 800)
    assert _writes(table, gen, 800)
    assert not _writes(table, gen, 800)  # an idle store: nothing new
    table.offsets[("T", 0)] = 6
    assert _writes(table, gen, 900)  # an append
    del table.offsets[("T", 1)]
    assert _writes(table, gen, 900)  # a deleted topic's queues go, the log's end unmoved
    assert table.load(900, gen) is not None and table.load(900, gen).offsets == {("T", 0): 6}
    gen.bump(900)  # a cut at the end itself: nothing else changed, but the file names the generation
    assert _writes(table, gen, 900)
    assert not _writes(table, gen, 900)
    saved = table.load(900, gen)
    assert saved is not None and saved.generation == gen.generation


def test_a_snapshot_of_the_live_table_is_compared_with_what_was_written(tmp_path: Path) -> None:
    """A cut saves the table it just installed, not a copy (CommitLog.truncate_to): later
    changes to that table must not make the file look current."""
    gen = LogGeneration(tmp_path / "generation.json")
    table = QueueOffsetTable(tmp_path / "queueOffsetTable.json")
    live = {("T", 0): 5, ("U", 0): 2}
    table.replace(live, 700)
    table.save(table.snapshot_at(700, gen, live), gen)
    del live[("U", 0)]  # the topic deleted afterwards, no append
    assert _writes(table, gen, 700)
    assert table.load(700, gen).offsets == {("T", 0): 5}
