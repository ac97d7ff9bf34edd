"""DecodedBatches (services.commitlog.decoded_batches): finding a kept batch by any of its
records, joining consecutive batches up to a limit and a byte budget, eviction."""

from __future__ import annotations

from libstore.dispatch_request import DispatchRequest
from services.commitlog.decoded_batches import DecodedBatches

SIZE = 100  # bytes per record in these batches


def _batch(start: int, n: int) -> tuple[int, int, list[DispatchRequest]]:
    requests = [DispatchRequest(True, SIZE, "T", 0, start + i * SIZE) for i in range(n)]
    return start, start + n * SIZE, requests


def _offsets(hit: tuple[int, list[DispatchRequest]] | None) -> list[int]:
    assert hit is not None
    return [r.commit_log_offset for r in hit[1]]


def test_find_answers_from_any_record_of_a_batch() -> None:
    kept = DecodedBatches(max_batches=10, max_records=100)
    kept.keep(*_batch(0, 4))
    kept.keep(*_batch(400, 4))
    assert _offsets(kept.find(0)) == [0, 100, 200, 300]
    assert _offsets(kept.find(600)) == [600, 700]
    assert kept.find(600)[0] == 800  # type: ignore[index]
    assert kept.find(650) is None  # not where a record starts
    assert kept.find(800) is None  # past the last batch
    assert kept.next_start(0) == 400 and kept.next_start(450) is None


def test_take_joins_consecutive_batches_within_the_limit_and_budget() -> None:
    kept = DecodedBatches(max_batches=10, max_records=100)
    for start in (0, 400, 800):
        kept.keep(*_batch(start, 4))
    kept.keep(*_batch(1300, 4))  # a gap before it (bytes not kept): never joined
    assert _offsets(kept.take(200, limit=1200, max_bytes=10_000)) == [200, 300, *range(400, 1200, 100)]
    assert kept.take(200, limit=1200, max_bytes=10_000)[0] == 1200  # type: ignore[index]
    assert kept.take(200, limit=800, max_bytes=10_000)[0] == 800  # type: ignore[index]
    assert kept.take(200, limit=300, max_bytes=10_000) is None  # its batch is not all confirmed
    assert kept.take(200, limit=1200, max_bytes=500)[0] == 400  # type: ignore[index]
    assert _offsets(kept.take(1300, limit=5000, max_bytes=10_000)) == [1300, 1400, 1500, 1600]


def test_eviction_by_batches_and_records_and_a_rewritten_log() -> None:
    kept = DecodedBatches(max_batches=3, max_records=10)
    for start in (0, 400, 800, 1200):
        kept.keep(*_batch(start, 4))
    assert kept.find(0) is None and kept.find(400) is None  # 10 records at most: two batches left
    assert len(kept) == 2 and kept.records == 8
    assert _offsets(kept.find(1200))[:1] == [1200]
    kept.keep(*_batch(600, 2))  # before the last one's end: the log was cut and written again
    assert len(kept) == 1 and kept.find(1200) is None and _offsets(kept.find(600)) == [600, 700]


def test_drop_before_removes_the_batches_every_reader_has_passed() -> None:
    kept = DecodedBatches(max_batches=10, max_records=100)
    for start in (0, 400, 800):
        kept.keep(*_batch(start, 4))
    kept.drop_before(300)  # inside the first batch: a reader still needs its last record
    assert len(kept) == 3 and kept.records == 12
    kept.drop_before(800)  # the first two end at or before 800
    assert len(kept) == 1 and kept.records == 4
    assert kept.find(400) is None and _offsets(kept.find(800)) == [800, 900, 1000, 1100]
    assert kept.next_start(0) == 800
    kept.drop_before(10_000)
    assert len(kept) == 0 and kept.records == 0 and kept.next_start(0) is None
    kept.keep(*_batch(1200, 2))  # keeping goes on after the cache emptied
    assert _offsets(kept.find(1200)) == [1200, 1300]
