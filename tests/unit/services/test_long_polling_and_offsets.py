"""Long polling (woken by dispatch, no busy loop) and the ConsumerOffsetManager."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

import pytest

from libstore import InvalidArgumentError, Message, StoreConfig, StoreIOError
from libstore.consumer_offset_manager import ConsumerOffsetManager
from libstore.long_polling import LongPollingService
from services.message_store import MessageStore


@pytest.fixture
def store(store_config: StoreConfig):
    s = MessageStore.open(store_config.replace(default_topic_queue_nums=2))
    s.put_messages([Message("T", b"first", 0)])
    assert s.wait_dispatched(10)
    yield s
    s.shutdown()


def test_a_held_pull_returns_when_a_message_arrives(store: MessageStore):
    result: dict[str, object] = {}

    def pull() -> None:
        t0 = time.monotonic()
        result["arrived"] = store.wait_for_messages("T", 0, 1, timeout_ms=30_000)
        result["waited_s"] = time.monotonic() - t0

    waiter = threading.Thread(target=pull)
    waiter.start()
    deadline = time.monotonic() + 10
    while store.long_polling.waiting == 0:  # the pull is held before the message is put
        assert time.monotonic() < deadline
        time.sleep(0.005)
    store.put_messages([Message("T", b"second", 0)])
    waiter.join(30)
    assert result["arrived"] is True
    assert result["waited_s"] < 15, "woken by dispatch, not by the 30 s hold time"
    assert store.get_messages("g", "T", 0, 1, 8).decode()[0].body == b"second"
    assert store.long_polling.waiting == 0


def test_a_held_pull_returns_after_the_hold_time_when_nothing_arrives(store: MessageStore):
    t0 = time.monotonic()
    assert store.wait_for_messages("T", 1, 0, timeout_ms=300) is False
    assert time.monotonic() - t0 >= 0.3
    assert store.wait_for_messages("T", 0, 0, timeout_ms=30_000) is True  # already there: no wait


def test_asyncio_waiters_are_woken_without_blocking_the_loop(store: MessageStore):
    async def scenario() -> tuple[bool, bool, int, bool]:
        ticks = 0

        async def ticker() -> None:  # runs only while nothing blocks the loop
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        held = asyncio.create_task(store.wait_for_messages_async("T", 0, 1, timeout_ms=30_000))
        deadline = time.monotonic() + 10
        while store.long_polling.waiting == 0:
            assert time.monotonic() < deadline, "the async pull was never held"
            await asyncio.sleep(0.005)
        before = ticks
        timed_out = await store.wait_for_messages_async("T", 1, 0, timeout_ms=100)
        ticks_while_held = ticks - before
        still_held = not held.done()
        await asyncio.to_thread(store.put_messages, [Message("T", b"x", 0)])
        arrived = await asyncio.wait_for(held, 15)
        ticking.cancel()
        return arrived, timed_out, ticks_while_held, still_held

    arrived, timed_out, ticks_while_held, still_held = asyncio.run(scenario())
    assert arrived is True and timed_out is False
    assert still_held, "the held pull returned before any message arrived"
    # 100 ms of waiting at 5 ms a tick: a blocked loop would tick at most once or twice.
    assert ticks_while_held >= 5, f"the loop ticked {ticks_while_held} times while two waits were pending"


def test_notify_wakes_only_waiters_below_the_new_max():
    maxes = {("T", 0): 0}
    service = LongPollingService(lambda t, q: maxes[(t, q)])
    woken: list[int] = []
    done = threading.Barrier(2)

    def wait(offset: int) -> None:
        if service.wait_for_messages("T", 0, offset, 5000):
            woken.append(offset)
        done.wait(10)

    t = threading.Thread(target=wait, args=(3,))
    t.start()
    deadline = time.monotonic() + 10
    while service.waiting == 0:
        assert time.monotonic() < deadline, "the waiter was never held"
        time.sleep(0.002)
    maxes[("T", 0)] = 2
    service.notify_message_arriving("T", 0, 2)  # offset 3 needs max > 3: stays held
    assert service.waiting == 1 and woken == []
    maxes[("T", 0)] = 4
    service.notify_message_arriving("T", 0, 4)
    done.wait(10)
    t.join(10)
    assert woken == [3] and service.waiting == 0


# -- ConsumerOffsetManager ------------------------------------------------------------------------
def test_offsets_default_commit_persist_and_reload(tmp_path: Path, caplog):
    path = tmp_path / "config" / "consumerOffset.json"
    manager = ConsumerOffsetManager(path)
    manager.load()
    assert manager.query_offset("g1", "T", 0) == -1
    manager.commit_offset("g1", "T", 0, 10)
    manager.commit_offset("g1", "T", 3, 2)
    manager.commit_offset("g2", "T", 0, 1)
    with caplog.at_level(logging.WARNING):
        manager.commit_offset("g1", "T", 0, 7)  # a reset backwards: allowed, logged
    assert "moves T-0 back from 10 to 7" in caplog.text
    manager.persist()
    data = json.loads(path.read_text())
    assert data == {"offsetTable": {"T@g1": {"0": 7, "3": 2}, "T@g2": {"0": 1}}}
    assert not path.with_name(path.name + ".tmp").exists()
    reloaded = ConsumerOffsetManager(path)
    reloaded.load()
    assert reloaded.query_offset("g1", "T", 0) == 7 and reloaded.offsets_of("g1", "T") == {0: 7, 3: 2}
    assert reloaded.groups() == [("g1", "T"), ("g2", "T")]


def test_offsets_reject_bad_input_and_corrupt_files(tmp_path: Path):
    manager = ConsumerOffsetManager(tmp_path / "o.json")
    for args in (("", "T", 0, 1), ("g@x", "T", 0, 1), ("g", "", 0, 1), ("g", "T", -1, 1), ("g", "T", 0, -5)):
        with pytest.raises(InvalidArgumentError):
            manager.commit_offset(*args)
    (tmp_path / "o.json").write_text("{not json")
    with pytest.raises(StoreIOError):
        ConsumerOffsetManager(tmp_path / "o.json").load()


def test_store_persists_offsets_at_shutdown(store_config: StoreConfig):
    s = MessageStore.open(store_config)
    s.put_messages([Message("T", b"x", 0)])
    assert s.wait_dispatched(10)
    s.commit_offset("g", "T", 0, 1)
    s.shutdown()
    s = MessageStore.open(store_config)
    try:
        assert s.query_offset("g", "T", 0) == 1
    finally:
        s.shutdown()
