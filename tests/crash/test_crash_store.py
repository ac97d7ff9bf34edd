"""Crash tests with real processes: a child runs the whole store (CommitLog, dispatch into
ConsumeQueues and IndexFiles) and appends from several threads, reporting each acknowledged
message over a pipe; the parent SIGKILLs it at random moments (one round inside a segment roll
window), reopens the store and checks what survived, including the derived stores.

SYNC_FLUSH: every acknowledged message is present and intact. ASYNC_FLUSH: the recovered log is
a valid prefix of each producer's stream (and, for a process crash, holds every acknowledged
message too, since the page cache survives the process). Either way the log ends cleanly and
queue offsets per queue are exactly 0..n-1 in log order.

With transient messages among them (every third one, DURABILITY=1), every acknowledged
persistent message is still there, and no transient one comes back: its stub keeps its place
in the log and its queue, but reads as removed, and no pull returns it or anything garbled.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from libstore import FlushDiskType, Message
from libstore.record_codec import BLANK_MAGIC_CODE
from services.message_store import MessageStore
from tests.crash._child import QUEUES, TOPIC, body_of, is_transient, store_config

SEGMENT = 256 * 1024
STREAMS = 4
REPO = Path(__file__).resolve().parents[2]


class Ack:
    __slots__ = ("phy", "qid", "qoff", "seq", "size", "stream")

    def __init__(self, line: str) -> None:
        stream, seq, phy, size, qid, qoff = (int(x) for x in line.split())
        self.stream, self.seq, self.phy, self.size, self.qid, self.qoff = stream, seq, phy, size, qid, qoff


class ChildRun:
    """One child process and the acknowledgements read from its stdout."""

    def __init__(self, root: Path, flush: FlushDiskType, starts: list[int], transient_every: int = 0) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.crash._child",
                str(root),
                flush.value,
                str(SEGMENT),
                ",".join(map(str, starts)),
                str(transient_every),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.acks: list[Ack] = []
        self.ready = threading.Event()
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("READY"):
                self.ready.set()
                continue
            ack = Ack(line)
            with self.changed:
                self.acks.append(ack)
                self.changed.notify_all()

    def wait_for(self, predicate, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not predicate(self.acks):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    rc = self.proc.poll()
                    err = self.proc.stderr.read() if rc is not None and self.proc.stderr else ""
                    raise AssertionError(f"child made no expected progress (rc={rc}): {err[-2000:]}")
                self.changed.wait(min(left, 0.2))

    def kill(self) -> list[Ack]:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.reader.join(30)  # the pipe still holds what the child wrote before dying
        assert self.proc.returncode == -signal.SIGKILL
        return self.acks


def _verify(
    root: Path, flush: FlushDiskType, acked: dict[tuple[int, int], Ack], rnd: int, transient_every: int = 0
) -> tuple[list[int], int]:
    """Reopen the store, check it, put one probe message, and return the next sequence number of
    every stream and where the recovered log's records ended. Probe messages (key
    ``probe-<round>``) belong to no stream."""
    store = MessageStore.open(store_config(str(root), flush, SEGMENT))
    log = store.commit_log
    try:
        report = log.recovery_report
        assert report is not None and not report.normal, "a SIGKILLed store must take abnormal recovery"
        # 1. The log is clean to its end: every record valid (CRC checked), contiguous.
        records = list(log.iter_records(log.min_offset, log.max_offset, check_crc=True))
        assert records, "nothing recovered"
        # The next record starts where the previous one ends or, when the rest of that segment
        # is the blank END filler, exactly at the start of the following segment.
        for a, b in itertools.pairwise(records):
            if b.commit_log_offset == a.next_offset:
                continue
            boundary = a.next_offset - a.next_offset % SEGMENT + SEGMENT
            assert b.commit_log_offset == boundary, f"gap between {a.next_offset} and {b.commit_log_offset}"
            filler = struct.unpack(">ii", log.get_message(a.next_offset, 8))
            assert filler == (boundary - a.next_offset, BLANK_MAGIC_CODE), f"no blank END at {a.next_offset}"
        end = records[-1].next_offset
        assert log.max_offset in (end, end - end % SEGMENT + SEGMENT)
        # 2. Queue offsets per queue are 0..n-1 in log order; the rebuilt table agrees.
        expect_next: dict[tuple[str, int], int] = {}
        seq_seen: dict[int, list[int]] = {s: [] for s in range(STREAMS)}
        present: dict[tuple[int, int], tuple[int, int, int]] = {}
        probes: list[int] = []
        for rec in records:
            key = (rec.topic, rec.queue_id)
            assert rec.consume_queue_offset == expect_next.get(key, 0), f"queue offset gap at {rec}"
            expect_next[key] = rec.consume_queue_offset + 1
            kind, _, num = rec.keys[0].partition("-")
            if kind == "probe":
                probes.append(int(num))
                continue
            stream, seq = int(kind), int(num)
            seq_seen[stream].append(seq)
            present[(stream, seq)] = (rec.commit_log_offset, rec.msg_size, rec.consume_queue_offset)
        assert log.queue_offset_table() == expect_next
        # 3. Each stream is an unbroken prefix of what its producer sent.
        for stream, seqs in seq_seen.items():
            assert seqs == list(range(len(seqs))), f"stream {stream} is not a prefix"
        # 4. Every acknowledged message is there, intact, where its ack said.
        for (stream, seq), ack in acked.items():
            if is_transient(seq, transient_every):
                # Never waited for: its stub may or may not have made it; either way it is gone.
                if (stream, seq) in present:
                    assert log.read_many([(ack.phy, ack.size)]) == [None], f"transient {stream}-{seq} is back"
                continue
            assert (stream, seq) in present, f"acknowledged message {stream}-{seq} lost ({flush.value})"
            assert present[(stream, seq)] == (ack.phy, ack.size, ack.qoff)
            rec = log.read_message(ack.phy, ack.size)
            assert rec.body == body_of(stream, seq) and rec.queue_id == ack.qid and rec.topic == TOPIC
        # 4b. Probes of earlier rounds were acknowledged under the same policy: they survive too.
        assert probes == list(range(rnd)), f"probe messages {probes} after {rnd} rounds"
        # 5. The derived stores agree with the recovered log: every record has its unit, no unit
        # points past the log's end, and every key is found by the index.
        assert store.wait_dispatched(60), "dispatch did not catch up with the recovered log"
        # 4c. Pulls return the persistent messages, whole, and nothing else.
        if transient_every:
            _pull_only_persistent(store, transient_every, len(records))
        for (topic, qid), n in expect_next.items():
            cq = store.consume_queue_store.find(topic, qid)
            assert cq is not None and cq.max_offset_in_queue == n, f"{topic}-{qid} has units past the log"
        for rec in records:
            unit = store.consume_queue_store.find(rec.topic, rec.queue_id).read_unit(rec.consume_queue_offset)
            assert (unit.phy_offset, unit.size) == (rec.commit_log_offset, rec.msg_size)
        for rec in records[:: max(1, len(records) // 300)] + records[-50:]:
            hits = store.query_message(rec.topic, rec.keys[0], 4)
            kind, _, num = rec.keys[0].partition("-")
            gone = kind != "probe" and is_transient(int(num), transient_every)  # indexed, removed
            expect = [] if gone else [rec.commit_log_offset]
            assert [h.phy_offset for h in hits] == expect, f"key {rec.keys[0]} not indexed"
        # 6. The store keeps working: one more put lands right after the end, with the next
        # queue offset of its queue.
        probe = store.put_messages([Message(TOPIC, b"after-crash", 0, keys=f"probe-{rnd}")])[0]
        assert probe.ok and probe.phy_offset in (end, log.queue.roll_next_file(end))
        assert probe.queue_offset == expect_next.get((TOPIC, 0), 0)
        return [len(seq_seen[s]) for s in range(STREAMS)], end
    finally:
        store.shutdown()


def _pull_only_persistent(store: MessageStore, transient_every: int, records: int) -> None:
    seen = 0
    for qid in range(QUEUES):
        offset = 0
        while True:
            result = store.get_messages("crash-check", TOPIC, qid, offset, 32)
            if not result.found and not result.removed:
                break
            for rec in result.decode():  # CRC checked
                seen += 1
                kind, _, num = rec.keys[0].partition("-")
                if kind == "probe":
                    continue
                stream, seq = int(kind), int(num)
                assert not is_transient(seq, transient_every), f"transient {stream}-{seq} came back"
                assert rec.body == body_of(stream, seq)
            seen += result.removed
            offset = result.next_begin_offset
    assert seen == records, "every unit pulled, or passed over as removed"


def _run_rounds(
    tmp_path: Path, flush: FlushDiskType, rounds: int, seed: int, transient_every: int = 0
) -> int:
    rng = random.Random(seed)
    root = tmp_path / "store"
    starts = [0] * STREAMS
    acked: dict[tuple[int, int], Ack] = {}
    roll_window: tuple[int, int] | None = None  # [start, end) of the segment tail round 1 killed in
    total_acks = 0
    for rnd in range(rounds):
        child = ChildRun(root, flush, starts, transient_every)
        assert child.ready.wait(60), "child did not start"
        baseline = len(child.acks)
        if rnd == 1:
            # Kill inside a segment roll window: the latest ack ends within the last 12 KiB of a
            # segment, so batches in flight cross into the next (pre-allocated) segment.
            def in_roll_window(acks: list[Ack]) -> bool:
                nonlocal roll_window
                last_end = acks[-1].phy + acks[-1].size if acks else 0
                if len(acks) > 50 and last_end % SEGMENT > SEGMENT - 12 * 1024:
                    boundary = last_end - last_end % SEGMENT + SEGMENT
                    roll_window = (boundary - 12 * 1024, boundary)
                    return True
                return False

            child.wait_for(in_roll_window)
        else:
            target = baseline + rng.randint(20, 400)
            child.wait_for(lambda acks, t=target: len(acks) >= t)
            time.sleep(rng.uniform(0, 0.05))
        acks = child.kill()
        for a in acks:
            acked[(a.stream, a.seq)] = a
        total_acks += len(acks)
        starts, recovered_end = _verify(root, flush, acked, rnd, transient_every)
        if rnd == 1:
            # The kill really came inside the roll window: the recovered log reaches it, and ends
            # in it or (the blank END filler checked above) somewhere past that segment.
            assert roll_window is not None and recovered_end >= roll_window[0], (
                f"recovered log ends at {recovered_end}, before the roll window {roll_window}"
            )
    return total_acks


def test_sync_flush_never_loses_an_acknowledged_message(tmp_path: Path):
    total = _run_rounds(tmp_path, FlushDiskType.SYNC_FLUSH, rounds=6, seed=20261122)
    assert total > 300


def test_no_transient_message_comes_back_and_every_persistent_one_stays(tmp_path: Path):
    total = _run_rounds(tmp_path, FlushDiskType.SYNC_FLUSH, rounds=3, seed=1127, transient_every=3)
    assert total > 100


def test_async_flush_recovers_a_valid_prefix(tmp_path: Path):
    total = _run_rounds(tmp_path, FlushDiskType.ASYNC_FLUSH, rounds=3, seed=7)
    assert total > 100
