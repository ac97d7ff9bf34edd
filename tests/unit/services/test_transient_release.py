"""services.dispatch.transient_release over real ConsumeQueues and consumer offsets, with a
commitlog stand-in that records the release plans: a queue nobody consumed holds its
transient messages, the slowest group decides, queues past their last transient stub hold
nothing, nothing past the dispatched offset is released, what is still wanted is named to keep
while it fits (else it caps the point), and only a plan that frees more is handed over."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from libstore import CommitLog, Message
from libstore.consume_queue import CQ_STORE_UNIT_SIZE
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.consumer_offset_manager import ConsumerOffsetManager
from libstore.dispatch import apply_chunk
from libstore.dispatch_request import DispatchRequest
from libstore.message import MessageSysFlag
from services.commitlog.local import LocalCommitLog
from services.dispatch import transient_release
from services.dispatch.transient_release import TransientRelease

SIZE = 100  # bytes per record: record i of the log starts at CommitLog offset 100 * i


class Port:
    def __init__(self) -> None:
        self.plans: list[tuple[int, list[int]]] = []

    async def release_transient(
        self, below: int, log_id: str = "", generation: int = 0, keep: Sequence[int] = ()
    ) -> int:
        self.plans.append((below, list(keep)))
        return 1


def _records(layout: list[tuple[str, bool]]) -> list[DispatchRequest]:
    """One record per (topic, transient) in log order, on queue 0 of each topic."""
    next_offset: dict[str, int] = {}
    out = []
    for i, (topic, transient) in enumerate(layout):
        qoff = next_offset.get(topic, 0)
        next_offset[topic] = qoff + 1
        flag = MessageSysFlag.TRANSIENT_STUB_FLAG if transient else 0
        out.append(DispatchRequest(True, SIZE, topic, 0, SIZE * i, qoff, flag, tags_code=0))
    return out


def _release(
    tmp_path: Path, layout: list[tuple[str, bool]]
) -> tuple[TransientRelease, ConsumerOffsetManager]:
    queues = ConsumeQueueStore(tmp_path / "cq", 64 * CQ_STORE_UNIT_SIZE)
    offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
    records = _records(layout)
    release = TransientRelease(queues, offsets, Port(), lambda: (SIZE * len(records), "log", 1))  # type: ignore[arg-type]
    apply_chunk([queues, release], records, arrivals=False)  # as dispatch does: grouped once for both
    return release, offsets


def test_stubs_are_noted_the_same_from_a_chunk_grouped_once_and_from_the_records(tmp_path: Path) -> None:
    """Dispatch hands the release each queue's last stub from the runs it grouped for the
    ConsumeQueues; dispatch_batch, from the records, notes the same; a replay of older records
    moves nothing back."""
    layout = [("T", True), ("U", False), ("T", False), ("U", True), ("T", True), ("U", False), ("P", False)]
    release, _ = _release(tmp_path / "grouped", layout)
    direct = TransientRelease(release.queues, release.offsets, Port(), release._position)  # type: ignore[arg-type]
    direct.dispatch_batch(_records(layout))
    assert release._last_stub == direct._last_stub == {("T", 0): 2, ("U", 0): 1}
    replay = _records(layout)[:2]
    apply_chunk([release.queues, release], replay, arrivals=False)
    direct.dispatch_batch(replay)
    assert release._last_stub == direct._last_stub == {("T", 0): 2, ("U", 0): 1}


def test_nobody_consumed_then_the_slowest_group_decides(tmp_path: Path) -> None:
    # Log: T0 T1 P0 T2 T3 (T: transient topic "T", P: persistent topic "P", never consumed)
    release, offsets = _release(tmp_path, [("T", True), ("T", True), ("P", False), ("T", True), ("T", True)])
    everything = [0, SIZE * 1, SIZE * 3, SIZE * 4]
    assert release.release_plan() == (SIZE * 5, everything)  # no group consumed "T": all kept
    offsets.commit_offset("fast", "T", 0, 4)
    assert release.release_plan() == (SIZE * 5, [])  # the only group read all: up to the end
    offsets.commit_offset("slow", "T", 0, 2)
    assert release.release_plan() == (SIZE * 5, [SIZE * 3, SIZE * 4])  # slow's next two
    offsets.commit_offset("slow", "T", 0, 4)
    assert release.release_plan() == (SIZE * 5, [])


def test_past_the_keep_budget_the_queues_with_most_to_keep_cap_the_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead-letter queue with a copy nobody reads is named; a backlog that does not fit in
    what is left of the budget holds the point at its first unconsumed unit instead."""
    monkeypatch.setattr(transient_release, "KEEP_MAX", 3)
    layout = [("T", True), ("%DLQ%g", True), ("T", True), ("T", True), ("T", True), ("T", True)]
    release, offsets = _release(tmp_path, layout)
    assert release.release_plan() == (SIZE * 0, [])  # T's 5 do not fit in 3 (the DLQ's 1 does)
    offsets.commit_offset("g", "T", 0, 2)
    assert release.release_plan() == (SIZE * 3, [SIZE * 1])  # T2..T4: 1 + 3 do not fit
    offsets.commit_offset("g", "T", 0, 3)
    assert release.release_plan() == (SIZE * 6, [SIZE * 1, SIZE * 4, SIZE * 5])  # 1 + 2 fit
    offsets.commit_offset("g", "T", 0, 1)  # moved back (an offset reset): T1 is wanted again
    assert release.release_plan() == (SIZE * 2, [SIZE * 1])


def test_a_group_without_an_offset_for_the_queue_holds_it_and_a_finished_queue_holds_nothing(
    tmp_path: Path,
) -> None:
    release, offsets = _release(tmp_path, [("T", True), ("U", True), ("T", False), ("U", False)])
    offsets.commit_offset("g", "T", 0, 2)
    assert release.release_plan() == (SIZE * 4, [SIZE * 1])  # "U" has no group: its stub is kept
    offsets.commit_offset("h", "U", 0, 1)  # past U's only transient stub (U1 is persistent)
    assert release.release_plan() == (SIZE * 4, [])
    # A later transient stub in "U" holds again, from h's offset: U1 (a persistent message: the
    # commitlog has nothing under its offset) and the new stub.
    more = DispatchRequest(True, SIZE, "U", 0, SIZE * 4, 2, MessageSysFlag.TRANSIENT_STUB_FLAG)
    release.queues.dispatch_batch([more])
    release.dispatch_batch([more])
    release._position = lambda: (SIZE * 5, "log", 1)
    assert release.release_plan() == (SIZE * 5, [SIZE * 3, SIZE * 4])


def test_rounds_hand_the_commitlog_only_a_plan_that_frees_more(tmp_path: Path) -> None:
    release, offsets = _release(tmp_path, [("T", True), ("T", True)])
    port = release.commitlog
    assert asyncio.run(release.release_once()) == 1  # point 2, both kept: a first plan goes
    assert asyncio.run(release.release_once()) == 0  # unchanged
    offsets.commit_offset("g", "T", 0, 1)
    assert asyncio.run(release.release_once()) == 1  # T0 is named no more
    assert asyncio.run(release.release_once()) == 0  # unchanged
    offsets.commit_offset("g", "T", 0, 2)
    asyncio.run(release.release_once())
    assert port.plans == [(SIZE * 2, [0, SIZE]), (SIZE * 2, [SIZE]), (SIZE * 2, [])]  # type: ignore[attr-defined]
    assert release.released_below == SIZE * 2 and release.messages_released == 3


def test_the_commitlog_frees_only_for_the_log_generation_the_point_was_computed_in(
    open_log: Callable[..., CommitLog],
) -> None:
    log = open_log()
    port = LocalCommitLog(log, None)
    sent = [Message("T", b"gone %d" % i, 0, properties={"DURABILITY": "1"}) for i in range(4)]
    res = log.put_messages(sent)
    assert len(log.transient) == 4
    gens = log.generation
    assert gens is not None
    end = res[3].phy_offset + res[3].size
    assert asyncio.run(port.release_transient(end, gens.log_id, gens.generation + 1)) == 0  # stale
    assert asyncio.run(port.release_transient(end, "another log", gens.generation)) == 0
    assert asyncio.run(port.release_transient(res[2].phy_offset, gens.log_id, gens.generation)) == 2
    assert len(log.transient) == 2 and log.read_message(res[3].phy_offset).body == b"gone 3"
    kept = [res[2].phy_offset]
    assert asyncio.run(port.release_transient(end, gens.log_id, gens.generation, kept)) == 1
    assert log.read_message(res[2].phy_offset).body == b"gone 2"


def test_a_restarted_dispatch_still_holds_what_was_noted_before_its_checkpoint(tmp_path: Path) -> None:
    """The noted stubs are saved with the checkpoint: a new TransientRelease that resumes
    dispatch past them (as after a restart) still holds the queue nobody consumed."""
    release, offsets = _release(tmp_path, [("T", True), ("T", True), ("P", False)])
    release.save()
    release.path.unlink()
    release.save()  # nothing noted since: no write
    assert not release.path.exists()
    release.dispatch_batch(
        [DispatchRequest(True, SIZE, "T", 0, SIZE * 1, 1, MessageSysFlag.TRANSIENT_STUB_FLAG)]
    )
    release.save()
    assert not release.path.exists()  # a stub noted again (a replay): nothing changed, no write
    release._changes += 1  # as a newly noted stub would
    release.save()
    again = TransientRelease(release.queues, offsets, Port(), lambda: (SIZE * 3, "log", 1))  # type: ignore[arg-type]
    assert again.release_plan() == (SIZE * 3, [])  # nothing noted: would free T0 and T1
    again.load()
    assert again.release_plan() == (SIZE * 3, [0, SIZE])
    offsets.commit_offset("g", "T", 0, 1)
    assert again.release_plan() == (SIZE * 3, [SIZE])


def test_after_a_cut_the_noted_stubs_are_clamped_to_the_queues_new_ends(tmp_path: Path) -> None:
    release, offsets = _release(tmp_path, [("T", True), ("T", True), ("T", True), ("U", True)])
    offsets.commit_offset("g", "T", 0, 2)
    offsets.commit_offset("g", "U", 0, 1)
    release.queues.truncate_dirty(SIZE * 1)  # the log was cut after record 0: T keeps T0, U nothing
    release.clamp()
    release._position = lambda: (SIZE * 1, "log", 2)
    # T's stub is now T0, which g consumed; U's was cut: nothing holds (no "unreadable unit" stall).
    assert release.release_plan() == (SIZE * 1, [])
