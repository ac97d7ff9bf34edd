"""The peers workload (``python -m bench --suite peers``): one run, the same for mqstore and for
each other broker, driven through the small :class:`PeerClient` interface.

A round uses a fresh queue (stream, topic) and runs three phases:

1. batch produce: ``batch_messages`` (100,000) in batches of ``batch_size`` (1,000), one batch in
   flight: the next batch is sent once every message of the previous one is acknowledged;
2. single produce: ``single_messages`` (5,000) one at a time, each waiting for its
   acknowledgement; the latency of each call is kept;
3. consume: every message of the round, read back and checked by :class:`SequenceCheck`
   (count, order by sequence number, length).

Bodies are ``body_bytes`` (1,024) long: the first 8 bytes are the message's sequence number in the
round (big-endian, from 0; the single-produce messages continue after the batches), the rest is
incompressible filler from bench.harness.payload_pool. Rates are medians over the rounds;
latency percentiles are over every single-produce call of all rounds. When the server's pid is
known its CPU time (bench.harness.process_tree_cpu_s) is read around each single-produce phase.
"""

from __future__ import annotations

import statistics
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bench.harness import (
    MESSAGE_SIZE,
    Recorder,
    Sample,
    body_at,
    process_tree_cpu_s,
    window_sample,
)

SEQ = struct.Struct(">Q")  # the sequence number heading every body: 8 bytes, big-endian
CONSUME_IDLE_S = 30.0  # a consume that receives nothing for this long fails (s)


class WorkloadError(Exception):
    """A round failed: a broker refused or lost a message, or the consumed messages do not check."""


class PeerClient(Protocol):
    """One broker as the workload drives it; a client lives for one round (one queue).

    Sync clients simply block inside these coroutines: nothing else runs on the loop."""

    async def open(self, queue: str) -> None:
        """Connect and create ``queue`` (a stream, topic or queue with one partition)."""

    async def produce_batch(self, bodies: Sequence[bytes]) -> None:
        """Send ``bodies`` in order; return once each one is acknowledged (raise otherwise)."""

    async def produce_one(self, body: bytes) -> None:
        """Send one message and wait for its acknowledgement (raise when refused)."""

    async def consume(self, expected: int, check: SequenceCheck) -> None:
        """Read the queue from its start, feeding each body to ``check``, until ``expected`` have
        come; raise WorkloadError when nothing arrives for CONSUME_IDLE_S."""

    async def close(self) -> None:
        """Delete the queue where the broker allows it, and disconnect."""


@dataclass(frozen=True)
class Workload:
    """The shape of a run (counts in messages, sizes in bytes)."""

    batch_messages: int = 100_000
    batch_size: int = 1_000
    single_messages: int = 5_000
    body_bytes: int = MESSAGE_SIZE
    rounds: int = 3

    @property
    def messages_per_round(self) -> int:
        """Messages one round produces and then consumes."""
        return self.batch_messages + self.single_messages


class SequenceCheck:
    """Checks consumed bodies: the n-th has sequence number n and is ``body_bytes`` long.

    A gap, a repeat or a reordering is reported once where it starts (the check then follows the
    sequence number it saw); :meth:`verify` also compares the count."""

    MAX_PROBLEMS = 5  # the first problems are kept; the rest only counted

    def __init__(self, body_bytes: int = MESSAGE_SIZE) -> None:
        self.body_bytes = body_bytes
        self.count = 0
        self.problem_count = 0
        self.problems: list[str] = []
        self._next_seq = 0

    def add(self, body: bytes) -> None:
        """Check the next consumed body."""
        index = self.count
        self.count += 1
        if len(body) != self.body_bytes:
            self._problem(f"message #{index}: {len(body)} bytes, expected {self.body_bytes}")
            if len(body) < SEQ.size:
                self._next_seq += 1
                return
        (seq,) = SEQ.unpack_from(body)
        if seq != self._next_seq:
            self._problem(f"message #{index}: sequence number {seq}, expected {self._next_seq}")
        self._next_seq = seq + 1

    def verify(self, expected: int) -> None:
        """Raise WorkloadError unless exactly ``expected`` messages came, in order, of full length."""
        if self.count != expected:
            self._problem(f"consumed {self.count} messages, expected {expected}")
        if self.problem_count:
            more = self.problem_count - len(self.problems)
            raise WorkloadError("; ".join(self.problems) + (f"; and {more} more" if more > 0 else ""))

    def _problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < self.MAX_PROBLEMS:
            self.problems.append(text)


def sequenced_bodies(pool: bytes, first_seq: int, count: int, body_bytes: int = MESSAGE_SIZE) -> list[bytes]:
    """``count`` bodies of ``body_bytes``, sequence numbers from ``first_seq``, filler from ``pool``."""
    filler = body_bytes - SEQ.size
    return [SEQ.pack(seq) + body_at(pool, seq, filler) for seq in range(first_seq, first_seq + count)]


@dataclass
class RoundResult:
    """One round: rates in messages per second, single-produce calls and server CPU seconds."""

    batch_msgs_per_s: float
    single: Sample
    consume_msgs_per_s: float | None  # None: the run does not consume (the floor)
    single_server_cpu_s: float | None  # None: no server pid


@dataclass
class WorkloadResult:
    """All rounds of one broker configuration; the properties summarise them."""

    rounds: list[RoundResult] = field(default_factory=list)

    @property
    def batch_msgs_per_s(self) -> float:
        """Median batch-produce rate over the rounds (msgs/s)."""
        return statistics.median(r.batch_msgs_per_s for r in self.rounds)

    @property
    def single_msgs_per_s(self) -> float:
        """Median single-produce rate over the rounds (msgs/s)."""
        return statistics.median(r.single.msgs_per_s for r in self.rounds)

    @property
    def consume_msgs_per_s(self) -> float | None:
        """Median consume rate over the rounds (msgs/s); None when not consumed."""
        rates = [r.consume_msgs_per_s for r in self.rounds if r.consume_msgs_per_s is not None]
        return statistics.median(rates) if rates else None

    def single_latency_ms(self, q: float) -> float:
        """The ``q``-th percentile of every single-produce call's latency, all rounds (ms)."""
        pooled = Sample(0, 0.0, [lat for r in self.rounds for lat in r.single.latencies_ns])
        return pooled.percentile_ms(q)

    @property
    def server_cpu_us_per_call(self) -> float | None:
        """Server CPU per single-message Produce (µs): CPU seconds over the single-produce
        phases divided by their calls; None without a server pid."""
        cpu = [r.single_server_cpu_s for r in self.rounds]
        if any(c is None for c in cpu):
            return None
        calls = sum(len(r.single.latencies_ns) for r in self.rounds)
        return sum(c for c in cpu if c is not None) / calls * 1e6 if calls else None


async def run_round(
    client: PeerClient,
    queue: str,
    workload: Workload,
    *,
    pool: bytes,
    server_pid: int | None = None,
    consume: bool = True,
) -> RoundResult:
    """One round on a fresh ``queue`` (see the module docstring); the client is opened and closed."""
    batches = [
        sequenced_bodies(
            pool, start, min(workload.batch_size, workload.batch_messages - start), workload.body_bytes
        )
        for start in range(0, workload.batch_messages, workload.batch_size)
    ]
    singles = sequenced_bodies(pool, workload.batch_messages, workload.single_messages, workload.body_bytes)
    await client.open(queue)
    try:
        t0 = time.perf_counter()
        for batch in batches:
            await client.produce_batch(batch)
        batch_rate = workload.batch_messages / (time.perf_counter() - t0)
        del batches

        rec = Recorder()
        cpu0 = process_tree_cpu_s(server_pid) if server_pid else 0.0
        start_ns = time.perf_counter_ns()
        for body in singles:
            sent = time.perf_counter_ns()
            await client.produce_one(body)
            rec.add(sent, time.perf_counter_ns(), 1)
        end_ns = time.perf_counter_ns() + 1
        cpu = process_tree_cpu_s(server_pid) - cpu0 if server_pid else None
        single = window_sample([rec], start_ns, end_ns)

        consume_rate = None
        if consume:
            check = SequenceCheck(workload.body_bytes)
            t0 = time.perf_counter()
            await client.consume(workload.messages_per_round, check)
            seconds = time.perf_counter() - t0
            check.verify(workload.messages_per_round)
            consume_rate = check.count / seconds
    finally:
        await client.close()
    return RoundResult(batch_rate, single, consume_rate, cpu)
