"""End to end through `mqstore serve` (the embedded suite as its own process): 100,000 messages
with keys and tags over 16 queues are consumed exactly once, in queue order, by a group; keys are
found by query; after a graceful restart (normal recovery) the group resumes from its offsets."""

from __future__ import annotations

import random
from pathlib import Path

from libstore.store_paths import abort_path
from services.client import Admin, OutgoingMessage, Producer, PullConsumer
from tests.service.harness import SMALL_STORE, ServeProcess, poll_until

TOTAL = 100_000
QUEUES = 16
TAGS = ["created", "paid", "shipped", "closed"]


def _serve(data: Path) -> tuple[ServeProcess, str]:
    """The embedded suite on a port the kernel picks; (process, its gateway address)."""
    args = ["--data", str(data), "--listen", "127.0.0.1:0"]
    for key, value in {**SMALL_STORE, "mappedFileSizeCommitLog": 32 * 1024 * 1024}.items():
        args += ["--set", f"{key}={value}"]
    proc = ServeProcess(args, log=data.parent / "serve.log")
    address = proc.bound_address()
    with Admin(address) as admin:
        try:
            admin.wait_until_serving(60)
        except Exception as exc:
            raise AssertionError(f"suite did not start: {exc}\n{proc.tail_log()}") from exc
    return proc, address


def _consume(address: str, group: str, want: int, idle_s: float) -> list:
    with PullConsumer(address, group, "E2E", batch_size=512) as consumer:
        got = poll_until(consumer, want, timeout_s=600, idle_s=idle_s, on_batch=lambda _: consumer.commit())
        consumer.commit()
    return got


def test_produce_consume_query_restart_resume(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    proc, address = _serve(data)
    try:
        with Admin(address) as admin:
            admin.create_topic("E2E", QUEUES)
        acked = 0
        with Producer(address) as producer:
            pending = []
            for start in range(0, TOTAL, 500):
                batch = [
                    OutgoingMessage("E2E", f"body-{i}".encode(), tags=TAGS[i % 4], keys=[f"key-{i}"])
                    for i in range(start, start + 500)
                ]
                pending.append(producer.send_batch_async(batch))
                if len(pending) >= 4:
                    results = pending.pop(0).result(60)
                    assert results.all_ok
                    acked += len(results)
            for fut in pending:
                results = fut.result(60)
                assert results.all_ok
                acked += len(results)
        assert acked == TOTAL

        got = _consume(address, "orders-service", TOTAL, idle_s=15)
        bodies = [r.body for r in got]
        assert len(bodies) == TOTAL and len(set(bodies)) == TOTAL, "each message exactly once"
        per_queue: dict[int, list[int]] = {}
        for r in got:
            per_queue.setdefault(r.queue_id, []).append(r.queue_offset)
            assert r.tags == TAGS[int(r.keys[0].removeprefix("key-")) % 4]
        assert sorted(per_queue) == list(range(QUEUES))
        assert all(offsets == list(range(len(offsets))) for offsets in per_queue.values()), "queue order"

        with Admin(address) as admin:
            for i in random.Random(5).sample(range(TOTAL), 100):
                hits = admin.query_by_key("E2E", f"key-{i}")
                assert [h.body for h in hits] == [f"body-{i}".encode()]
            assert admin.consumer_progress("orders-service", "E2E").total_lag == 0
    finally:
        assert proc.terminate() == 0, proc.tail_log()
    for role in ("commitlog", "dispatch", "index"):
        assert not abort_path(data / role).exists(), f"{role} did not shut down cleanly"
    before = len(proc.tail_log(10**9))

    proc, address = _serve(data)
    try:
        restart_log = proc.tail_log(10**9)[before:]
        assert "normal recovery: log ends at" in restart_log, restart_log[-3000:]
        assert "abnormal recovery" not in restart_log
        assert _consume(address, "orders-service", 1, idle_s=2) == [], "resumes after its committed offsets"
        with Producer(address) as producer:
            assert producer.send_batch(
                [OutgoingMessage("E2E", b"after-restart-%d" % i) for i in range(10)]
            ).all_ok
        later = _consume(address, "orders-service", 10, idle_s=10)
        assert sorted(r.body for r in later) == sorted(b"after-restart-%d" % i for i in range(10))
    finally:
        assert proc.terminate() == 0
