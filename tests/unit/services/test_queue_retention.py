"""QueueRetention (services.dispatch.retention): floors saved, applied after a restart, and
brought back to the log's end when the log is cut below them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from libstore.consume_queue_store import ConsumeQueueStore
from libstore.dispatch_request import DispatchRequest
from libstore.retention_policy import RetentionPolicy
from services.dispatch.retention import QueueRetention


async def _never(_phy: int, _size: int) -> int:
    raise AssertionError("a tombstone needs no store time")


def _store(root: Path) -> ConsumeQueueStore:
    store = ConsumeQueueStore(root, 20 * 100)
    store.load()
    return store


def test_floors_survive_a_restart_and_a_cut_brings_them_back(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.dispatch_batch(
        [DispatchRequest(True, 100, "Gone", 0, 1000 + 100 * i, i, store_timestamp=1) for i in range(10)]
    )
    cq = store.find("Gone", 0)
    assert cq is not None
    retention = QueueRetention(store, _never)
    policy = RetentionPolicy(default_ms=1, deleted_before={"Gone": 1500})
    asyncio.run(retention.run_once(policy, now_ms=0))
    assert cq.min_offset_in_queue == 5 and retention.units_expired == 5
    assert retention.floors == {"Gone": {0: 1500}}

    store.flush_all()
    again_store = _store(tmp_path)  # a restart: the queue's own files say min 0
    again_store.recover()
    again_cq = again_store.find("Gone", 0)
    assert again_cq is not None and again_cq.min_offset_in_queue == 0
    again = QueueRetention(again_store, _never)
    again.load()
    again.apply_saved()
    assert again_cq.min_offset_in_queue == 5

    again.clamp(1200)  # the log was cut at 1200: what comes from there on is new
    assert again.floors == {"Gone": {0: 1200}}
    reloaded = QueueRetention(again_store, _never)
    reloaded.load()
    assert reloaded.floors == {"Gone": {0: 1200}}
