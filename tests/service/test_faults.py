"""Faults in the split topology (four real processes): a commitlog SIGKILLed while producing
under SYNC_FLUSH loses no acknowledged message and duplicates none; dispatch and index SIGKILLed
with their data deleted rebuild from the log and consumers see every message."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from services.client import Admin, OutgoingMessage, Producer, PullConsumer
from tests.service.harness import SplitCluster, poll_until

pytestmark = pytest.mark.crash


def _drain(address: str, group: str, topic: str, idle_s: float = 6.0, want: int | None = None) -> list:
    with PullConsumer(address, group, topic, batch_size=512) as consumer:
        return poll_until(consumer, want, timeout_s=180, idle_s=idle_s, poll_ms=300)


def _assert_queues_contiguous(records: list) -> None:
    per_queue: dict[int, list[int]] = {}
    for r in records:
        per_queue.setdefault(r.queue_id, []).append(r.queue_offset)
    for qid, offsets in per_queue.items():
        assert offsets == list(range(len(offsets))), f"queue {qid} has gaps or repeats"


def test_commitlog_sigkill_under_sync_flush(tmp_path: Path):
    cluster = SplitCluster(tmp_path / "c", flush="SYNC_FLUSH")
    cluster.start_all()
    try:
        with Admin(cluster.gateway) as admin:
            admin.create_topic("Durable", 4)
        acked: set[str] = set()
        unsure = 0
        stop = threading.Event()
        progress = threading.Condition()

        def produce() -> None:
            nonlocal unsure
            n = 0
            with Producer(cluster.gateway, timeout_s=5, retries=8) as producer:
                while not stop.is_set():
                    keys = [f"m{n + i}" for i in range(32)]
                    n += 32
                    try:
                        results = producer.send_batch(
                            [OutgoingMessage("Durable", k.encode(), keys=[k]) for k in keys]
                        )
                    except Exception:  # commitlog down: neither acked nor known to be lost
                        unsure += 32
                        time.sleep(0.1)
                        continue
                    with progress:
                        acked.update(keys[: results.appended] if results.all_ok else [])
                        progress.notify_all()

        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        with progress:
            assert progress.wait_for(lambda: len(acked) >= 1500, 60), "no progress before the kill"
        cluster.procs["commitlog"].kill()
        time.sleep(0.3)
        cluster.start("commitlog")
        cluster.wait_serving(60)
        before = len(acked)
        with progress:
            assert progress.wait_for(lambda: len(acked) >= before + 1000, 60), "no progress after the restart"
        stop.set()
        thread.join(30)

        got = _drain(cluster.gateway, "checker", "Durable")
        keys = [r.keys[0] for r in got]
        assert len(keys) == len(set(keys)), "a message was stored twice"
        missing = acked - set(keys)
        assert not missing, (
            f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]} ({unsure} unsure)"
        )
        _assert_queues_contiguous(got)
        assert "abnormal recovery" in (cluster.root / "commitlog.log").read_text()
    finally:
        cluster.stop_all()


def test_dispatch_and_index_rebuild_after_sigkill_and_data_loss(tmp_path: Path):
    cluster = SplitCluster(tmp_path / "c")
    cluster.start_all()
    try:
        with Admin(cluster.gateway) as admin:
            admin.create_topic("Rebuilt", 8)
        with Producer(cluster.gateway) as producer:
            for start in range(0, 6000, 500):
                batch = [
                    OutgoingMessage("Rebuilt", b"r%d" % i, keys=[f"r{i}"]) for i in range(start, start + 500)
                ]
                assert producer.send_batch(batch).all_ok
        assert len(_drain(cluster.gateway, "early", "Rebuilt", idle_s=2, want=2000)) >= 2000  # mid-stream
        for role in ("dispatch", "index"):
            cluster.procs[role].kill()
            shutil.rmtree(cluster.root / role)
        with Producer(cluster.gateway) as producer:  # the commitlog keeps taking messages meanwhile
            assert producer.send_batch(
                [OutgoingMessage("Rebuilt", b"r%d" % i, keys=[f"r{i}"]) for i in range(6000, 6500)]
            ).all_ok
        for role in ("dispatch", "index"):
            cluster.start(role)
        cluster.wait_serving(60)
        got = _drain(cluster.gateway, "after", "Rebuilt", want=6500)
        assert sorted(r.body for r in got) == sorted(b"r%d" % i for i in range(6500))
        _assert_queues_contiguous(got)
        with Admin(cluster.gateway) as admin:
            for i in (0, 1234, 5999, 6499):
                assert [h.body for h in admin.query_by_key("Rebuilt", f"r{i}")] == [b"r%d" % i]
    finally:
        cluster.stop_all()
