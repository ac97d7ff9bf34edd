"""Spark jobs over a store's CommitLog files (services.spark.jobs, ``mqstore spark``): rebuild
matches what dispatch built byte for byte, verify finds a planted bit flip, stats counts; files
cut into runs of records read as whole files do."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from libstore import StoreConfig
from services.client import Admin, OutgoingMessage, Producer
from services.spark import jobs
from services.spark.commitlog_source import (
    CommitLogDataSource,
    CommitLogReader,
    commitlog_files,
    commitlog_partitions,
    walk,
)
from tests.service.conftest import embedded_options
from tests.service.harness import SMALL_STORE, InProcessSuites, derived_files

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stopped embedded suite's data folder: 3 topics (one with delays held in the timer
    topic), keys, tags, and enough bytes to roll two CommitLog files of 8 MiB."""
    root = tmp_path_factory.mktemp("jobs") / "data"
    suites = InProcessSuites()
    try:
        suite = suites.start(embedded_options(root))
        suites.wait_ready(suite)
        with Admin(suite.address) as admin:
            admin.create_topic("Orders", 4)
            admin.create_topic("Audit", 2)
        with Producer(suite.address) as producer:
            body = b"x" * 2000
            for b in range(60):
                batch = [
                    OutgoingMessage("Orders", body, tags=f"t{i % 3}", keys=[f"o{b}-{i}"]) for i in range(90)
                ] + [OutgoingMessage("Audit", b"a", keys=[f"a{b}-{i}", f"b{b}-{i}"]) for i in range(10)]
                assert producer.send_batch(batch).all_ok
            assert producer.send("Orders", b"later", delay_level=18).all_ok  # held: the timer topic
        time.sleep(0.5)
    finally:
        suites.close()  # flushes and checkpoints dispatch and index
    return root


def _commitlog(root: Path) -> Path:
    (folder,) = {p.parent for p in root.rglob("commitlog/*") if p.name.isdigit()}
    return folder


def _relative_cq(files: dict[str, bytes]) -> dict[str, bytes]:
    return {k[k.index("consumequeue/") :]: v for k, v in files.items()}


def test_rebuild_writes_what_dispatch_built(spark: Any, store: Path, tmp_path: Path) -> None:
    built = derived_files(store)
    out = tmp_path / "rebuilt"
    report = jobs.rebuild(spark, _commitlog(store), out, StoreConfig.from_mapping(SMALL_STORE))
    assert report.records == 60 * 100 + 1
    (out / "index").rename(out / "index-tmp")  # derived_files expects <root>/index/index
    (out / "index").mkdir()
    (out / "index-tmp").rename(out / "index" / "index")
    rebuilt = derived_files(out)
    assert built["cq"] and len(built["index"]) >= 1
    assert _relative_cq(rebuilt["cq"]) == _relative_cq(built["cq"])  # every ConsumeQueue file, byte for byte
    assert any("rmq_sys_wheel_timer" in k for k in rebuilt["cq"])
    assert rebuilt["index"] == built["index"]
    with pytest.raises(FileExistsError):
        jobs.rebuild(spark, _commitlog(store), out, StoreConfig.from_mapping(SMALL_STORE))


@pytest.mark.slow
def test_verify_finds_a_bit_flip_and_stats_count(spark: Any, store: Path, tmp_path: Path) -> None:
    clean = jobs.verify(spark, _commitlog(store))
    assert clean.ok and clean.records == 6001 and len(clean.files) >= 2
    assert all(f.starts_at_base for f in clean.files)

    damaged = tmp_path / "commitlog"
    shutil.copytree(_commitlog(store), damaged)
    second = commitlog_files(damaged)[1]
    # One bit in the body of an Orders record (2,000 bytes after a 92-byte header) of file 2.
    pos = next(p for p, req, _ in walk(second.path, second.base_offset) if req and req.msg_size > 2000)
    with open(second.path, "r+b") as fh:
        fh.seek(pos + 500)
        byte = fh.read(1)[0]
        fh.seek(pos + 500)
        fh.write(bytes([byte ^ 0x10]))
    report = jobs.verify(spark, damaged)
    assert not report.ok and report.crc_failures == 1 and report.unreadable == 0
    assert [f.crc_failures for f in report.files] == [0, 1] + [0] * (len(report.files) - 2)
    assert report.records == clean.records  # the damaged record is still located, and flagged

    rows = jobs.stats(spark, _commitlog(store))
    per_topic: dict[str, int] = {}
    for r in rows:
        per_topic[r["topic"]] = per_topic.get(r["topic"], 0) + r["messages"]
    assert per_topic == {"Orders": 5400, "Audit": 600, "rmq_sys_wheel_timer": 1}
    assert sum(r["bytes"] for r in rows) == sum(f.bytes for f in clean.files)

    # The CLI: a table, and exit status 1 for the damaged copy.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli",
            "spark",
            "verify",
            str(damaged),
            "--master",
            "local[1]",
            "--no-show-progress",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "DAMAGED" in proc.stdout and "1 CRC failures" in proc.stdout


def test_messages_view_and_a_record_that_is_not_where_it_says(
    spark: Any, store: Path, tmp_path: Path
) -> None:
    """The CRC covers only the body: a damaged header is caught by the record's own offset
    (PHYSICALOFFSET), as recovery catches it. The file reads up to there and reports the rest
    unreadable."""
    damaged = tmp_path / "commitlog"
    shutil.copytree(_commitlog(store), damaged)
    second = commitlog_files(damaged)[1]
    positions = [p for p, _, _ in walk(second.path, second.base_offset)]
    tenth = positions[9]
    with open(second.path, "r+b") as fh:  # PHYSICALOFFSET: header bytes 28..35
        fh.seek(tenth + 35)
        byte = fh.read(1)[0]
        fh.seek(tenth + 35)
        fh.write(bytes([byte ^ 0x01]))
    rows = spark.read.format("mqstore-commitlog").load(str(damaged)).collect()
    name = Path(second.path).name
    in_second = sorted((r for r in rows if r.file == name), key=lambda r: r.commitlog_offset)
    assert [r.crc_ok for r in in_second] == [True] * 9 + [False]
    bad = in_second[-1]
    assert (bad.size, bad.commitlog_offset, bad.topic) == (-1, second.base_offset + tenth, None)
    good = in_second[0]
    assert good.topic in ("Orders", "Audit") and good.commitlog_offset == second.base_offset
    assert good.size > 0 and good.body and good.msg_id
    first_file = [r for r in rows if r.file != name]
    assert first_file and all(r.crc_ok for r in first_file)
    report = jobs.verify(spark, damaged)
    assert not report.ok and report.unreadable == 1 and report.crc_failures == 0


def _rows(folder: Path, view: str, max_partition_bytes: int) -> tuple[int, list[tuple[Any, ...]]]:
    """(partitions, every row's (file, offset, size, crc_ok, topic)) as the reader's partitions
    give them, read in the executors' code without Spark."""
    reader = CommitLogReader(str(folder), view, max_partition_bytes)
    parts = reader.partitions()
    rows = [
        (r["file"], r["commitlog_offset"], r["size"], r["crc_ok"], r["topic"])
        for part in parts
        for batch in reader.read(part)
        for r in batch.to_pylist()
    ]
    return len(parts), rows


@pytest.mark.parametrize("view", ["messages", "dispatch"])
def test_files_cut_into_runs_read_as_whole_files_do(store: Path, view: str) -> None:
    """Files larger than maxPartitionBytes are read as runs of records that tile them: the same
    rows, in the same order, as one partition a file."""
    folder = _commitlog(store)
    files = commitlog_files(folder)
    whole_parts, whole = _rows(folder, view, 1 << 40)
    assert whole_parts == len(files)
    runs = commitlog_partitions(folder, 1024 * 1024)
    assert len(runs) > 2 * len(files)
    for f in files:
        mine = [r for r in runs if r.path == f.path]
        assert mine[0].start == 0 and mine[-1].end == -1
        assert all(a.end == b.start for a, b in pairwise(mine))
    cut_parts, cut = _rows(folder, view, 1024 * 1024)
    assert cut_parts == len(runs) and cut == whole and len(whole) > 5000


def test_no_run_starts_past_bytes_that_are_not_a_record(store: Path, tmp_path: Path) -> None:
    """A file whose tenth record says it is somewhere else: cut every 4 KiB, it still reads its
    first nine records and one unreadable row, and nothing after (no run starts past it)."""
    damaged = tmp_path / "commitlog"
    shutil.copytree(_commitlog(store), damaged)
    second = commitlog_files(damaged)[1]
    tenth = [p for p, _, _ in walk(second.path, second.base_offset)][9]
    with open(second.path, "r+b") as fh:  # PHYSICALOFFSET: header bytes 28..35
        fh.seek(tenth + 35)
        byte = fh.read(1)[0]
        fh.seek(tenth + 35)
        fh.write(bytes([byte ^ 0x01]))
    runs = [r for r in commitlog_partitions(damaged, 4096) if r.path == second.path]
    assert len(runs) > 1 and all(r.start <= tenth for r in runs)
    for view in ("messages", "dispatch"):
        _, whole = _rows(damaged, view, 1 << 40)
        _, cut = _rows(damaged, view, 4096)
        assert cut == whole
        in_second = [r for r in cut if r[0] == Path(second.path).name]
        assert [r[3] for r in in_second] == [True] * 9 + [False]


def test_spark_reads_the_runs_and_refuses_a_bad_partition_size(spark: Any, store: Path) -> None:
    folder = str(_commitlog(store))
    read = spark.read.format("mqstore-commitlog")
    whole = read.load(folder).select("commitlog_offset").collect()
    cut = read.option("maxPartitionBytes", str(1024 * 1024)).load(folder)
    assert cut.rdd.getNumPartitions() > 2 * len(commitlog_files(folder))
    assert sorted(r[0] for r in cut.select("commitlog_offset").collect()) == sorted(r[0] for r in whole)
    for bad in ("0", "-5", "lots"):
        source = CommitLogDataSource({"path": folder, "maxPartitionBytes": bad})
        with pytest.raises(ValueError, match="maxPartitionBytes must be a positive number of bytes"):
            source.reader(source.schema())  # type: ignore[arg-type]


def test_by_default_files_are_cut_only_when_the_store_is_small_for_the_cores(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fixture's store has a full file of 8 MiB and a newer one holding under a third of
    that: one core has enough files (two); for three, the full file holds more than 1.5 times a
    core's share, and files are cut into runs of RUN_BYTES, unless they hold more than the walk
    may read."""
    from services.spark import commitlog_source

    folder = _commitlog(store)
    files = commitlog_files(folder)
    holding = [f for f in files if commitlog_source._holds_records(f.path)]
    assert len(holding) == 2
    monkeypatch.setattr(commitlog_source, "RUN_BYTES", 1024 * 1024)
    assert commitlog_partitions(folder, 0, 1) == files
    cut = commitlog_partitions(folder, 0, 3)
    assert cut == commitlog_partitions(folder, 1024 * 1024) and len(cut) > 2 * len(files)
    monkeypatch.setattr(commitlog_source, "_default_parallelism", lambda: 3)
    assert CommitLogReader(str(folder), "messages").partitions() == cut
    monkeypatch.setattr(commitlog_source, "DEFAULT_WALK_MAX_BYTES", 4 * 1024 * 1024)
    assert commitlog_partitions(folder, 0, 3) == files


def test_one_partition_a_file_is_kept_while_the_files_are_even() -> None:
    from services.spark.commitlog_source import _uneven

    gib = 1 << 30
    assert not _uneven([gib, gib], 2)  # as many full files as cores
    assert not _uneven([gib, gib - 4_000_000], 2)  # the newest's end of records, short of its size
    assert not _uneven([gib], 1)
    assert _uneven([gib], 2)  # one file, two cores
    assert _uneven([gib, 150_000_000], 2)  # the benchmark's store: a full file and a little more
    assert not _uneven([gib] * 3 + [150_000_000], 4)


def test_a_record_failing_its_crc_inside_a_cut_file_is_read_past(store: Path, tmp_path: Path) -> None:
    """A body byte flipped in a record of the second file (the tenth or the next with a body of
    2,000 bytes): the runs go on past it, and read it with crc_ok false and the rest of the file
    as a whole-file walk does."""
    damaged = tmp_path / "commitlog"
    shutil.copytree(_commitlog(store), damaged)
    second = commitlog_files(damaged)[1]
    walked = list(walk(second.path, second.base_offset))
    data = Path(second.path).read_bytes()
    # The first record from the tenth on with an Orders body (2,000 bytes of b"x"): flip one.
    tenth, at = next(
        (pos, pos + found + 1000)
        for pos, req, _ in walked[9:]
        if req is not None and (found := data.find(b"x" * 2000, pos, pos + req.msg_size)) >= 0
    )
    with open(second.path, "r+b") as fh:
        fh.seek(at)
        fh.write(bytes([data[at] ^ 0x01]))
    runs = [r for r in commitlog_partitions(damaged, 4096) if r.path == second.path]
    assert any(r.start > tenth for r in runs)
    for view in ("messages", "dispatch"):
        _, whole = _rows(damaged, view, 1 << 40)
        _, cut = _rows(damaged, view, 4096)
        assert cut == whole
        in_second = [r for r in cut if r[0] == Path(second.path).name]
        assert [r[3] for r in in_second].count(False) == 1 and len(in_second) == len(walked)
