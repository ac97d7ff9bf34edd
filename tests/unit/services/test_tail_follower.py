"""TailFollower (services._common.tail_follower) over an in-process CommitLog: it applies what
the log confirms to its dispatchers, and ``wait_for`` answers once its reput offset passes an
offset, or when its time runs out, without leaving waiters behind."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from libstore import CommitLog, StoreConfig
from libstore.dispatch_request import DispatchRequest
from services._common.tail_follower import TailFollower
from services.client import OutgoingMessage, Producer
from services.commitlog.local import LocalCommitLog


class Recorder:
    """A dispatcher that keeps the CommitLog offsets of the records it is given."""

    def __init__(self) -> None:
        self.offsets: list[int] = []

    def dispatch_batch(self, requests: Sequence[DispatchRequest]) -> None:
        self.offsets += [r.commit_log_offset for r in requests]


def test_wait_for_answers_when_the_reput_offset_passes_or_time_runs_out(store_config: StoreConfig) -> None:
    log = CommitLog.open(store_config.replace(default_topic_queue_nums=2))
    try:
        port = LocalCommitLog(log)
        recorder = Recorder()
        producer = Producer("127.0.0.1:1")

        async def run() -> None:
            follower = TailFollower("test", port, [recorder], 0)
            follower.start()
            try:
                assert await follower.wait_for(0, 0.01)  # already there
                assert not await follower.wait_for(1, 0.05)  # nothing appended: times out
                assert follower._waiters == []
                later = asyncio.create_task(follower.wait_for(10**6, 0.2))  # further than anything
                soon = asyncio.create_task(follower.wait_for(1, 5))
                batch = [OutgoingMessage("T", b"m%d" % i) for i in range(5)]
                results = await port.append_records(producer._request(batch).records)
                assert await soon
                assert follower.reput_offset == log.max_offset
                assert recorder.offsets == results.phy_offsets
                assert not await later
                assert follower._waiters == []
            finally:
                await follower.stop()

        asyncio.run(run())
        producer.close()
    finally:
        log.shutdown()
