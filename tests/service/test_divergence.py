"""When the CommitLog loses a tail and then grows past it again (a returning master cut what its
successor never had, or a crash recovery cut unflushed bytes), dispatch and index drop what they
derived from the lost bytes: their files end up exactly as a rebuild from the log, whether the
cut happens while they follow the log or while they are stopped."""

from __future__ import annotations

from pathlib import Path

from libstore import BrokerRole, CommitLog, Message
from services.client import Admin, OutgoingMessage, Producer
from services.serve import ServeOptions, Suite, store_config
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites, rebuild_derived, wait_derived_caught_up


def _produce(address: str, prefix: str, n: int) -> list[int]:
    offsets: list[int] = []
    with Producer(address) as producer:
        for start in range(0, n, 200):
            batch = [
                OutgoingMessage("Cut", b"%s%d" % (prefix.encode(), i), tags=prefix, keys=[f"{prefix}{i}"])
                for i in range(start, min(start + 200, n))
            ]
            results = producer.send_batch(batch)
            assert results.all_ok
            offsets += results.phy_offsets
    return offsets


def _cut(log: CommitLog, offset: int) -> None:
    """What a demotion does to the log: become a SLAVE, cut, (later) be promoted again."""
    log.set_broker_role(BrokerRole.SLAVE)
    log.truncate_to(offset)
    log.set_broker_role(BrokerRole.ASYNC_MASTER)


def _assert_equals_rebuild(suites: InProcessSuites, options: ServeOptions, root: Path) -> None:
    built, rebuilt = rebuild_derived(suites, options, root)
    assert rebuilt["cq"] == built["cq"], "ConsumeQueues still hold units for the lost tail"
    assert rebuilt["index"] == built["index"], "IndexFiles still hold entries for the lost tail"


def _start_with_old_messages(suites: InProcessSuites, root: Path) -> tuple[ServeOptions, Suite, list[int]]:
    """An embedded suite over ``root`` holding 3000 messages "old0".."old2999" in topic Cut,
    all dispatched and indexed; returns its options, the suite and the messages' offsets."""
    options = embedded_options(root, maxIndexNum=3000, maxHashSlotNum=101)
    suite = suites.start(options)
    suites.wait_ready(suite)
    with Admin(suite.address) as admin:
        admin.create_topic("Cut", 3)
    offsets = _produce(suite.address, "old", 3000)
    wait_derived_caught_up(suite)
    return options, suite, offsets


def test_followers_drop_a_cut_tail_while_following(suites: InProcessSuites, tmp_path: Path):
    root = tmp_path / "data"
    options, suite, offsets = _start_with_old_messages(suites, root)
    assert suite.commit_log is not None and suite.commitlog_port is not None
    generation = suite.commit_log.generation.generation
    _cut(suite.commit_log, offsets[1000])
    suite.commitlog_port.forget_recent()
    _produce(suite.address, "new", 4000)  # the log grows well past where it ended before
    wait_derived_caught_up(suite)
    assert suite.dispatch_app is not None and suite.dispatch_app.follower is not None
    assert suite.dispatch_app.follower.generation == generation + 1
    with Admin(suite.address) as admin:
        assert admin.query_by_key("Cut", "old2500") == []  # gone with the tail
        assert [v.body for v in admin.query_by_key("Cut", "old999")] == [b"old999"]
        assert [v.body for v in admin.query_by_key("Cut", "new3999")] == [b"new3999"]
    suites.stop(suite)
    _assert_equals_rebuild(suites, options, root)


def test_followers_drop_a_tail_cut_while_they_were_stopped(suites: InProcessSuites, tmp_path: Path):
    root = tmp_path / "data"
    options, suite, offsets = _start_with_old_messages(suites, root)
    suites.stop(suite)  # dispatch and index checkpoint generation 1 at the old end

    log = CommitLog.open(store_config(options, root / "commitlog"))
    try:
        old_end = log.max_offset
        _cut(log, offsets[500])
        added = 0
        while log.max_offset <= old_end + 100_000:  # regrow past the old end
            log.put_messages([Message("Cut", b"z" * 700, i % 3, keys=f"z{i}") for i in range(100)])
            added += 100
        expected = sum(log.queue_offset_of("Cut", q) for q in range(3))
        assert expected == 500 + added
    finally:
        log.shutdown()

    suite = suites.start(options)
    suites.wait_ready(suite)
    wait_derived_caught_up(suite)
    with Admin(suite.address) as admin:
        assert admin.query_by_key("Cut", "old2000") == []
        progress = admin.consumer_progress("nobody", "Cut")
        assert sum(q.max_offset for q in progress.queues) == expected
    suites.stop(suite)
    _assert_equals_rebuild(suites, options, root)
