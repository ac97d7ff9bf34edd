"""The peers benchmark's parts that need no broker: the consume check, a round against an
in-memory broker, skipped rows for missing brokers or client packages, the ratio columns."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from bench import peer_bench, peer_servers
from bench.harness import Sample, payload_pool, process_tree_cpu_s
from bench.peer_workload import (
    RoundResult,
    SequenceCheck,
    Workload,
    WorkloadError,
    WorkloadResult,
    run_round,
    sequenced_bodies,
)

FACTS = {"date": "today", "cpu": "cpu", "cores": "2", "python": "3.11", "filesystem": "ext4"}


def _bodies(count: int) -> list[bytes]:
    return sequenced_bodies(payload_pool(1 << 16), 0, count)


def _check(bodies: Sequence[bytes], expected: int) -> None:
    check = SequenceCheck()
    for body in bodies:
        check.add(body)
    check.verify(expected)


def test_check_accepts_every_message_in_order() -> None:
    _check(_bodies(50), 50)


def test_check_detects_a_reordered_message() -> None:
    bodies = _bodies(10)
    bodies[3], bodies[4] = bodies[4], bodies[3]
    with pytest.raises(WorkloadError, match=r"message #3: sequence number 4, expected 3"):
        _check(bodies, 10)


def test_check_detects_a_missing_message() -> None:
    bodies = _bodies(10)
    del bodies[6]
    with pytest.raises(
        WorkloadError, match=r"message #6: sequence number 7, expected 6.*consumed 9 messages"
    ):
        _check(bodies, 10)


def test_check_detects_a_repeated_message_even_when_the_count_matches() -> None:
    bodies = _bodies(10)
    bodies[9] = bodies[8]
    with pytest.raises(WorkloadError, match=r"message #9: sequence number 8, expected 9"):
        _check(bodies, 10)


@pytest.mark.parametrize("length", [1023, 1025, 4])
def test_check_detects_a_message_of_the_wrong_length(length: int) -> None:
    bodies = _bodies(5)
    bodies[2] = (bodies[2] + b"x")[:length]
    with pytest.raises(WorkloadError, match=rf"message #2: {length} bytes, expected 1024"):
        _check(bodies, 5)


def test_bodies_carry_their_sequence_number_first() -> None:
    bodies = sequenced_bodies(payload_pool(1 << 16), 7, 3)
    assert [int.from_bytes(b[:8], "big") for b in bodies] == [7, 8, 9]
    assert {len(b) for b in bodies} == {1024}
    assert bodies[0][8:] != bodies[1][8:]  # random filler, not one repeated body


class MemoryBroker:
    """A PeerClient keeping one queue in a list; ``lose`` drops that message index."""

    def __init__(self, lose: int = -1) -> None:
        self.lose = lose
        self.produced = 0
        self.queue: list[bytes] = []
        self.closed = False

    async def open(self, queue: str) -> None:
        self.queue = []

    async def produce_batch(self, bodies: Sequence[bytes]) -> None:
        for body in bodies:
            await self.produce_one(body)

    async def produce_one(self, body: bytes) -> None:
        if self.produced != self.lose:
            self.queue.append(body)
        self.produced += 1

    async def consume(self, expected: int, check: SequenceCheck) -> None:
        for body in self.queue[:expected]:
            check.add(body)

    async def close(self) -> None:
        self.closed = True


SMALL = Workload(batch_messages=2_500, batch_size=1_000, single_messages=30, rounds=1)


def test_a_round_produces_batches_and_singles_then_consumes_them_checked() -> None:
    broker = MemoryBroker()
    result = asyncio.run(run_round(broker, "q", SMALL, pool=payload_pool(1 << 16), server_pid=os.getpid()))
    assert len(broker.queue) == 2_530
    assert [int.from_bytes(b[:8], "big") for b in broker.queue] == list(range(2_530))
    assert len(result.single.latencies_ns) == 30
    assert result.consume_msgs_per_s is not None and result.consume_msgs_per_s > 0
    assert result.single_server_cpu_s is not None
    assert broker.closed


def test_a_round_fails_when_the_broker_loses_a_message() -> None:
    broker = MemoryBroker(lose=1_200)
    with pytest.raises(WorkloadError, match="message #1200: sequence number 1201, expected 1200"):
        asyncio.run(run_round(broker, "q", SMALL, pool=payload_pool(1 << 16)))
    assert broker.closed


def test_a_missing_broker_binary_makes_a_skipped_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing installed here
    monkeypatch.setattr(peer_servers, "_SBIN", ())
    spec = next(s for s in peer_bench.default_specs() if s.key == "redis-always")
    spec = dataclasses.replace(spec, requires=())  # the client package may be absent too
    row = peer_bench.run_peer(spec, tmp_path, SMALL)
    assert row.result is None and row.failed is None
    assert row.skipped == "redis-server is not installed (make bench-deps)"
    lines = peer_bench.markdown([row], FACTS, SMALL)
    assert "| Redis 7 Streams | AOF, appendfsync always | after the AOF's fsync | skipped | - |" in "\n".join(
        lines
    )
    assert "- Redis 7 Streams, AOF, appendfsync always: skipped: redis-server is not installed" in "\n".join(
        lines
    )


def test_a_missing_client_package_makes_a_skipped_row_before_any_server_starts(tmp_path: Path) -> None:
    def no_server(root: Path) -> object:
        raise AssertionError("the server must not start without its client")

    spec = peer_bench.PeerSpec(
        "x",
        "X",
        "cfg",
        "ack",
        "ASYNC_FLUSH",
        no_server,
        MemoryBroker,
        (("no_such_module_xyz", "xyz-client"),),  # type: ignore[arg-type]
    )
    row = peer_bench.run_peer(spec, tmp_path, SMALL)
    assert row.skipped == "Python package xyz-client is not installed (make bench-deps)"


def _result(batch: float, single: float, consume: float | None) -> WorkloadResult:
    single_sample = Sample(int(single), 1.0, [1_000_000] * int(single))
    return WorkloadResult([RoundResult(batch, single_sample, consume, 0.001 * single)])


def test_ratio_columns_divide_the_compared_mqstore_row_by_the_peer() -> None:
    specs = {s.key: s for s in peer_bench.default_specs()}
    rows = [
        peer_bench.PeerRow(specs["floor"], _result(1000.0, 400.0, None)),
        peer_bench.PeerRow(specs["mqstore-async"], _result(300.0, 200.0, 500.0)),
        peer_bench.PeerRow(specs["redis-everysec"], _result(100.0, 400.0, 1000.0)),
    ]
    text = "\n".join(peer_bench.markdown(rows, FACTS, SMALL))
    assert "| ASYNC_FLUSH | 3.00x | 0.50x | 0.50x |" in text  # the Redis row
    assert "| ASYNC_FLUSH | 0.30x | 0.50x | - |" in text  # the floor row: no consume
    assert "| ASYNC_FLUSH single rate / floor | 0.50 | >= 0.8 | no |" in text
    assert "| server CPU per single Produce, ASYNC_FLUSH (µs) | 1,000 | <= 250 | no |" in text
    assert "| SYNC_FLUSH single rate / floor | - | >= 0.6 | - |" in text  # not measured: no verdict


def test_process_cpu_counts_this_process_and_nothing_for_a_gone_pid() -> None:
    before = process_tree_cpu_s(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert process_tree_cpu_s(os.getpid()) > before
    assert process_tree_cpu_s(2**22 + 1) == 0.0  # above pid_max's default: never a live pid


def test_process_cpu_keeps_what_an_exited_child_used() -> None:
    """A server's forked child (Redis's AOF rewrite) that burns CPU and exits must not make
    the server's CPU go down between two readings: once reaped, it counts in cutime."""
    before = process_tree_cpu_s(os.getpid())
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", burn])
    time.sleep(0.2)
    during = process_tree_cpu_s(os.getpid())
    child.wait()  # reaped: its /proc entry is gone
    after = process_tree_cpu_s(os.getpid())
    assert after >= during
    assert after - before >= 0.3


def test_alternated_rows_keep_their_servers_up_and_take_turns_round_by_round(tmp_path: Path) -> None:
    """The floor and mqstore rows run side by side: every server starts before the first round
    and stops after the last, rounds alternate between the rows, and a row whose round breaks
    off is failed without stopping the others."""
    events: list[str] = []

    class Recording(MemoryBroker):
        def __init__(self, key: str, fail_round: int = -1) -> None:
            super().__init__()
            self.key, self.fail_round = key, fail_round

        async def open(self, queue: str) -> None:
            events.append(f"round {queue}")
            if queue.endswith(f"-{self.fail_round}"):
                raise WorkloadError("refused")
            await super().open(queue)

    def server(key: str) -> object:
        @contextlib.contextmanager
        def running(root: Path) -> Iterator[peer_servers.PeerServer]:
            assert root.is_dir()
            events.append(f"start {key}")
            yield peer_servers.PeerServer(os.getpid(), 0, {}, root / "log")
            events.append(f"stop {key}")

        return running

    def spec(key: str, fail_round: int = -1) -> peer_bench.PeerSpec:
        return peer_bench.PeerSpec(
            key,
            key,
            "cfg",
            "ack",
            None,
            server(key),
            lambda s: Recording(key, fail_round),  # type: ignore[arg-type]
        )

    rows = peer_bench.run_alternating(
        [spec("a"), spec("b", fail_round=1)], tmp_path, dataclasses.replace(SMALL, rounds=3)
    )
    assert events == [
        "start a",
        "start b",
        "round peers-a-0",
        "round peers-b-0",
        "round peers-a-1",
        "round peers-b-1",
        "round peers-a-2",
        "stop b",
        "stop a",
    ]
    assert rows[0].result is not None and len(rows[0].result.rounds) == 3
    assert rows[1].result is None and rows[1].failed == "WorkloadError: refused"
