"""The simulated power loss itself (tests/fault/powerloss.py), and the store's durability claims
checked with it in one process: what was fdatasynced survives, what was not may be rewound; a
name is durable once its folder is fsynced; a cut (a slave's truncation) stays cut."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from libstore import BrokerRole, CommitLog, Message, StoreConfig, durability_hooks
from libstore.mapped_file import MappedFile, offset_to_file_name
from tests.fault.powerloss import DurabilityRecorder, lose_power

SIZE = 64 * 1024
REPO = Path(__file__).resolve().parents[2]


class Rewind(random.Random):
    """A power loss that keeps nothing unsynced: every changed sector goes back."""

    def random(self) -> float:
        return 0.3


class KeepAll(random.Random):
    """A power loss after the kernel wrote everything back: every changed sector stays."""

    def random(self) -> float:
        return 0.9


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[DurabilityRecorder]:
    rec = DurabilityRecorder(tmp_path / "data", tmp_path / "shadow")
    durability_hooks.install(rec)
    yield rec
    durability_hooks.install(None)


def test_unsynced_writes_are_rewound_and_synced_ones_kept(tmp_path: Path, recorder: DurabilityRecorder):
    data = tmp_path / "data"
    data.mkdir()
    mf = MappedFile.create(data / offset_to_file_name(0), SIZE)
    mf.append_records(b"a" * 5000)
    mf.flush(0)
    mf.append_records(b"b" * 3000)  # never synced
    mf.close()
    report = lose_power(data, tmp_path / "shadow", Rewind())
    on_disk = (data / offset_to_file_name(0)).read_bytes()
    assert on_disk[:5000] == b"a" * 5000 and not any(on_disk[5120:8000])  # sectors past 5120 rewound
    assert report.sectors_old >= 5 and report.sectors_new == 0
    assert lose_power(data, tmp_path / "shadow", KeepAll()).sectors_old == 0  # nothing differs now


def test_names_count_once_their_folder_is_synced(tmp_path: Path, recorder: DurabilityRecorder):
    data = tmp_path / "data"
    (data / "other").mkdir(parents=True)
    gone = data / "other" / "fresh"
    recorder.created(gone, 4096)  # created, its folder never fsynced
    gone.write_bytes(bytes(4096))
    mf = MappedFile.create(data / offset_to_file_name(0), SIZE)  # create fsyncs its folder
    mf.append_records(b"x" * 100)
    mf.flush(0)
    mf.destroy()  # unlinked, folder not fsynced: it comes back
    report = lose_power(data, tmp_path / "shadow", Rewind())
    assert not gone.exists() and report.names_lost == ["other/fresh"]
    assert (data / offset_to_file_name(0)).read_bytes()[:100] == b"x" * 100
    assert report.names_back == [offset_to_file_name(0)]


def test_the_abort_marker_is_durable(tmp_path: Path, recorder: DurabilityRecorder):
    """A power loss right after start must still find the abort marker (else the next start
    takes normal recovery over a log that was never flushed), and after a clean stop must not."""
    from libstore.store_directory import StoreDirectory

    root = tmp_path / "data" / "store"
    directory = StoreDirectory(root)
    directory.mark_running()
    directory.release()
    lose_power(tmp_path / "data", tmp_path / "shadow", Rewind())
    directory = StoreDirectory(root)
    assert not directory.last_exit_ok
    directory.mark_clean()
    directory.release()
    lose_power(tmp_path / "data", tmp_path / "shadow", Rewind())
    assert StoreDirectory(root).last_exit_ok


def test_a_slave_cut_stays_cut_through_a_power_loss(tmp_path: Path, recorder: DurabilityRecorder):
    """truncate_to makes the cut durable before the new epochs are written: after a power loss
    the records past it do not come back (they would be taken for the new master's)."""
    config = StoreConfig(
        store_path_root_dir=str(tmp_path / "data" / "slave"),
        mapped_file_size_commit_log=256 * 1024,
        max_message_size=64 * 1024,
        broker_role=BrokerRole.SLAVE,
    )
    master = CommitLog.open(
        config.replace(store_path_root_dir=str(tmp_path / "master"), broker_role=BrokerRole.ASYNC_MASTER)
    )
    try:
        results = master.put_messages([Message("T", b"m" * 500, 0) for _ in range(100)])
        slave = CommitLog.open(config)
        offset = 0
        while offset < master.max_offset:
            data, offset = master.read_chunk(offset, master.max_offset, 64 * 1024)
            slave.append_replica(slave.max_offset, data)
        slave.queue.flush_to(slave.max_offset)
        cut = results[40].phy_offset
        slave.truncate_to(cut)
        slave.abandon()  # the power goes: nothing more is written or synced
    finally:
        master.shutdown()
    lose_power(tmp_path / "data", tmp_path / "shadow", Rewind())
    again = CommitLog.open(config)
    try:
        assert again.max_offset == cut
    finally:
        again.shutdown()


_KILLED_STORE = """
import os, signal, sys
from pathlib import Path
from libstore import CommitLog, Message, StoreConfig, durability_hooks
from tests.fault.powerloss import DurabilityRecorder
root, mode = Path(sys.argv[1]), sys.argv[2]
durability_hooks.install(DurabilityRecorder(root / "data", root / "shadow"))
config = StoreConfig(store_path_root_dir=str(root / "data" / "store"), mapped_file_size_commit_log=256 * 1024,
                     max_message_size=64 * 1024, flush_interval_commit_log=3_600_000,
                     flush_commit_log_thorough_interval=3_600_000)
cl = CommitLog.open(config)
if mode == "write":
    cl.put_messages([Message("T", b"k" * 500, 0) for _ in range(1200)])  # over two segments
print(cl.max_offset, cl.flushed_offset, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed(root: Path, mode: str) -> list[int]:
    """Run the store in a process that is SIGKILLed once it wrote (or recovered): no flush at exit."""
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_STORE, str(root), mode],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return [int(x) for x in proc.stdout.split()]


def test_recovery_syncs_what_a_killed_process_left_in_the_page_cache(tmp_path: Path):
    """Records a killed process wrote but never flushed are in the page cache: recovery keeps
    them (they validate) and must fdatasync them before calling them flushed, or a power loss
    right after takes records consumers were already shown."""
    end, flushed = _killed(tmp_path, "write")
    assert flushed < end  # nothing was flushed
    recovered, recovered_flushed = _killed(tmp_path, "recover")
    assert recovered == recovered_flushed == end
    lose_power(tmp_path / "data", tmp_path / "shadow", Rewind())  # and now the power goes
    again = CommitLog.open(
        StoreConfig(
            store_path_root_dir=str(tmp_path / "data" / "store"),
            mapped_file_size_commit_log=256 * 1024,
            max_message_size=64 * 1024,
        )
    )
    try:
        assert again.max_offset == end
    finally:
        again.shutdown()
