"""Crash-test child: appends batches from several producer threads and reports every
acknowledged message on stdout as ``stream seq phy_offset size queue_id queue_offset``.

Run as ``python -m tests.crash._child <store> <SYNC_FLUSH|ASYNC_FLUSH> <segment> <starts>
[<transient every>]`` where ``starts`` is ``n0,n1,...``: the next sequence number of each
stream, and with ``transient every`` N > 0 every message whose sequence number N divides is
transient (DURABILITY=1, see :func:`is_transient`). The parent SIGKILLs this process at a moment
of its choosing.
"""

from __future__ import annotations

import sys
import threading

from libstore import FlushDiskType, Message, StoreConfig
from services.message_store import MessageStore

TOPIC = "CrashTopic"
QUEUES = 4


def body_of(stream: int, seq: int) -> bytes:
    size = 40 + (seq * 7919 + stream * 104729) % 2500
    head = f"{stream}:{seq}:".encode()
    return (head * (size // len(head) + 1))[:size]


def is_transient(seq: int, every: int) -> bool:
    return every > 0 and seq % every == 0


def queue_of(stream: int, seq: int) -> int:
    return (stream * 7 + seq) % QUEUES


def store_config(root: str, flush: FlushDiskType, segment: int) -> StoreConfig:
    """Small files everywhere so kills land during CommitLog, ConsumeQueue and IndexFile rolls."""
    return StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=segment,
        max_message_size=16 * 1024,
        flush_disk_type=flush,
        flush_interval_commit_log=20,
        default_topic_queue_nums=QUEUES,
        mapped_file_size_consume_queue=100 * 20,
        max_hash_slot_num=97,
        max_index_num=400,
        flush_interval_consume_queue=50,
        flush_consume_queue_thorough_interval=300,
    )


def main() -> None:
    root, flush, segment, starts = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    every = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    log = MessageStore.open(store_config(root, FlushDiskType(flush), segment))
    out = sys.stdout
    out_lock = threading.Lock()
    print("READY", flush=True)

    def produce(stream: int, seq: int) -> None:
        while True:
            batch = 1 + (seq % 9)
            msgs = [
                Message(
                    TOPIC,
                    body_of(stream, s),
                    queue_of(stream, s),
                    keys=f"{stream}-{s}",
                    properties={"DURABILITY": "1"} if is_transient(s, every) else None,
                )
                for s in range(seq, seq + batch)
            ]
            results = log.put_messages(msgs)
            lines = []
            for s, r in zip(range(seq, seq + batch), results, strict=True):
                if not r.ok:
                    raise SystemExit(f"put failed: {r.status.name}")
                lines.append(f"{stream} {s} {r.phy_offset} {r.size} {queue_of(stream, s)} {r.queue_offset}\n")
            with out_lock:
                out.write("".join(lines))
                out.flush()
            seq += batch

    threads = [
        threading.Thread(target=produce, args=(stream, int(n)), daemon=True)
        for stream, n in enumerate(starts.split(","))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
