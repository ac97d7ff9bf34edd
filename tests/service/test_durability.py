"""Transient messages end to end: a transient topic and the DURABILITY property through both
forms of our Produce and RocketMQ 5's SendMessage, consumed by pull (tag filter, offsets) and by
the official client's receive, in the embedded suite and the split topology; never written to
disk; gone after a restart, where consumers go on at the next offset."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from libstore.errors import SystemBusyError
from services.client import Admin, OutgoingMessage, Producer, PullConsumer
from services.serve import ServeOptions, Suite
from tests.rocketmq.harness import run_driver
from tests.service.conftest import embedded_options
from tests.service.harness import (
    InProcessSuites,
    SplitCluster,
    poll_until,
    scrape,
    value,
    wait_derived_caught_up,
    wait_until,
)


def _bodies(topic: str, tag: str, marker: str, n: int, **props: str) -> list[OutgoingMessage]:
    return [
        OutgoingMessage(topic, f"{marker}-{i}".encode() * 8, tags=tag, properties=dict(props))
        for i in range(n)
    ]


def _on_disk(root: Path, marker: bytes) -> list[str]:
    """Files under ``root`` holding ``marker``."""
    return [str(p) for p in root.rglob("*") if p.is_file() and marker in p.read_bytes()]


def _produce_mixed(address: str) -> dict[str, list[bytes]]:
    """Transient messages by topic and by property, in both Produce forms, next to persistent
    ones; returns the bodies sent per topic."""
    with Admin(address) as admin:
        admin.create_topic("Volatile", 2, durability="transient")
        admin.create_topic("Mixed", 2)
        durability = {t.topic_name: t.durability.value for t in admin.list_topics()}
        assert (durability["Volatile"], durability["Mixed"]) == ("transient", "persistent")
    sent: dict[str, list[bytes]] = {"Volatile": [], "Mixed": []}
    for encode_records in (True, False):
        form = "rec" if encode_records else "msg"
        batches = [
            _bodies("Volatile", "a", f"VOLATILE{form}", 5),
            _bodies("Volatile", "b", f"VOLATILE{form}b", 3),
            _bodies("Mixed", "a", f"KEPT{form}", 4),
            _bodies("Mixed", "a", f"GONE{form}", 4, DURABILITY="1"),
        ]
        with Producer(address, encode_records=encode_records, retries=0) as producer:
            for batch in batches:
                assert producer.send_batch(batch).all_ok
                sent[batch[0].topic] += [m.body for m in batch]
    return sent


def _start(suites: InProcessSuites, options: ServeOptions) -> Suite:
    suite = suites.start(options)
    suites.wait_ready(suite)
    return suite


def _restart(suites: InProcessSuites, suite: Suite, options: ServeOptions) -> Suite:
    """Stop ``suite`` once dispatch and index hold what it confirmed; start it again on its data."""
    wait_derived_caught_up(suite)
    suites.stop(suite)
    return _start(suites, options)


def _pull(address: str, group: str, topic: str, tags: str = "*", want: int | None = None) -> list:
    with PullConsumer(address, group, topic, tag_expression=tags) as consumer:
        return poll_until(consumer, want, 20, idle_s=None if want else 1.5)


@pytest.mark.parametrize("topology", ["embedded", "split"])
def test_transient_messages_are_consumed_like_any_other_and_never_reach_the_disk(
    topology: str, suites: InProcessSuites, tmp_path: Path
) -> None:
    if topology == "embedded":
        suite = _start(suites, embedded_options(tmp_path / "data"))
        address, data, cluster = suite.address, tmp_path / "data", None
    else:
        cluster = SplitCluster(tmp_path / "split")
        cluster.start_all()
        address, data = cluster.gateway, tmp_path / "split"
    try:
        sent = _produce_mixed(address)
        got = _pull(address, "g1", "Volatile", want=16)
        assert sorted(r.body for r in got) == sorted(sent["Volatile"])
        only_b = _pull(address, "g2", "Volatile", tags="b", want=6)
        assert sorted(r.body for r in only_b) == sorted(b for b in sent["Volatile"] if b"b-" in b)
        mixed = _pull(address, "g3", "Mixed", want=16)
        assert sorted(r.body for r in mixed) == sorted(sent["Mixed"])
        gone = [r for r in mixed if b"GONE" in r.body]
        assert {r.properties.get("DURABILITY") for r in gone} == {"1"}
        per_queue: dict[int, list[int]] = {}
        for r in mixed:
            per_queue.setdefault(r.queue_id, []).append(r.queue_offset)
        assert all(sorted(v) == list(range(len(v))) for v in per_queue.values())  # one offset sequence
    finally:
        if cluster is not None:
            cluster.stop_all()
        else:
            suites.stop(suite)
    for marker in (b"VOLATILE", b"GONE"):
        assert _on_disk(data, marker) == []  # never flushed, never paged out at this size
    assert _on_disk(data, b"KEPT")  # the persistent ones are there


def test_after_a_restart_transient_messages_are_gone_and_consumers_go_on(
    suites: InProcessSuites, tmp_path: Path
) -> None:
    options = embedded_options(tmp_path / "data")
    suite = _start(suites, options)
    sent = _produce_mixed(suite.address)
    with PullConsumer(suite.address, "early", "Volatile") as consumer:  # a group that read it all
        assert len(poll_until(consumer, 16, 20)) == 16
        consumer.commit()
    suite = _restart(suites, suite, options)
    with Producer(suite.address) as producer:
        assert producer.send_batch(_bodies("Mixed", "a", "AFTER", 2)).all_ok
        assert producer.send_batch(_bodies("Volatile", "a", "AFTERV", 2)).all_ok
    kept = _pull(suite.address, "late", "Mixed")
    assert sorted(r.body for r in kept) == sorted(
        [b for b in sent["Mixed"] if b.startswith(b"KEPT")] + [f"AFTER-{i}".encode() * 8 for i in range(2)]
    )
    volatile = _pull(suite.address, "late", "Volatile")
    assert sorted(r.body for r in volatile) == sorted(f"AFTERV-{i}".encode() * 8 for i in range(2))
    # Offsets went on after the lost messages: the new ones follow them in each queue, and the
    # group that had read the lost ones goes on with the new ones.
    assert min(r.queue_offset for r in volatile) >= 8
    early = _pull(suite.address, "early", "Volatile")
    assert sorted(r.body for r in early) == sorted(r.body for r in volatile)


@pytest.mark.rocketmq
def test_official_client_sends_transient_messages_with_a_user_property(
    suites: InProcessSuites, tmp_path: Path
) -> None:
    options = embedded_options(tmp_path / "data")
    suite = _start(suites, options)
    address = suite.address
    with Admin(address) as admin:
        admin.create_topic("Official", 2)
        admin.upsert_group("og", consume_from="earliest")
    messages = [{"body": f"OFFICIALT-{i}", "props": {"DURABILITY": "1"}} for i in range(3)]
    messages.append({"body": "OFFICIALP-0"})
    args = {"endpoint": address, "topic": "Official", "messages": messages}
    sent = run_driver("send", args, tmp_path / "s")
    assert not sent["errors"] and len(sent["ids"]) == 4
    got = run_driver(
        "simple",
        {"endpoint": address, "group": "og", "topic": "Official", "expect": 4, "timeout_s": 30},
        tmp_path / "r",
    )
    assert sorted(m["body"] for m in got["messages"]) == sorted(m["body"] for m in messages)
    bad = [{"body": "x", "props": {"DURABILITY": "yes"}}]
    refused = run_driver("send", {**args, "messages": bad}, tmp_path / "bad")
    assert not refused["ids"] and "DURABILITY" in refused["errors"][0]
    # Sent again after a restart: the transient ones are gone, the receive gets the rest.
    run_driver("send", args, tmp_path / "s2")
    suite = _restart(suites, suite, options)
    with Admin(suite.address) as admin:
        admin.upsert_group("og2", consume_from="earliest")
    again = run_driver(
        "simple",
        {"endpoint": suite.address, "group": "og2", "topic": "Official", "expect": 3, "timeout_s": 8},
        tmp_path / "r2",
    )
    assert sorted(m["body"] for m in again["messages"]) == ["OFFICIALP-0", "OFFICIALP-0"]


def _send_through_pushback(producer: Producer, batch: list[OutgoingMessage], deadline: float) -> None:
    """Send ``batch``, again after a SYSTEM_BUSY push back (nothing of it was written), as a
    client under flow control does, until ``deadline`` (time.monotonic())."""
    while True:
        try:
            assert producer.send_batch(batch).all_ok
            return
        except SystemBusyError:
            assert time.monotonic() < deadline, "the transient store stayed full"
            time.sleep(0.2)


def _release_count(
    suite: Suite | None, cluster: SplitCluster | None, what: str = "rounds"
) -> Callable[[], float]:
    """How many transient release rounds the dispatch service has run (``what`` "rounds") or
    messages they freed ("messages"): counted in process, or scraped from the split dispatch
    process's metrics endpoint (started with ``--metrics-listen``, see _SPLIT_METRICS)."""
    if suite is not None:
        assert suite.dispatch_app is not None
        release = suite.dispatch_app.transient_release
        return lambda: release.rounds if what == "rounds" else release.messages_released
    assert cluster is not None
    endpoint = cluster.procs["dispatch"].metrics_address()
    return lambda: value(scrape(endpoint), "mqstore_transient_release_total", what=what)


def _release_rounds_pass(rounds_run: Callable[[], float], rounds: int) -> None:
    """Wait until ``rounds`` more release rounds ran (each ran whole: the count moves after)."""
    until = rounds_run() + rounds
    wait_until(lambda: rounds_run() >= until, f"{rounds} transient release rounds")


_SPLIT_METRICS = {"dispatch": ["--metrics-listen", "127.0.0.1:0"]}


@pytest.mark.parametrize("topology", ["embedded", "split"])
def test_transient_messages_every_group_consumed_are_freed_and_the_rest_are_kept(
    topology: str, suites: InProcessSuites, tmp_path: Path
) -> None:
    """Transient bounds of 512 KiB in memory and 512 KiB paged out. Messages sent before any
    group consumed the topic are kept; a group that keeps up lets four times the bounds through
    (they are freed as it commits, around an older message of another topic that nobody reads,
    as a dead-letter copy would be); messages a second group has not consumed yet are kept for
    it while the first group has read them; once both have, they are freed."""
    store = {"transientStoreMaxBytes": 512 * 1024, "transientScratchMaxBytes": 512 * 1024}
    if topology == "embedded":
        suite = _start(suites, embedded_options(tmp_path / "data", **store))
        address, cluster = suite.address, None
    else:
        suite = None
        cluster = SplitCluster(tmp_path / "split", store=store, role_args=_SPLIT_METRICS)
        cluster.start_all()
        address = cluster.gateway
    rounds_run = _release_count(suite, cluster)
    try:
        with Admin(address) as admin:
            admin.create_topic("Drained", 1, durability="transient")
            admin.create_topic("Unread", 1, durability="transient")
        body = bytes(1000)
        deadline = time.monotonic() + 120
        with Producer(address, retries=0) as producer:
            assert producer.send("Unread", b"nobody reads me yet").all_ok
            early = [OutgoingMessage("Drained", b"early%04d" % i + body) for i in range(200)]
            _send_through_pushback(producer, early, deadline)
            _release_rounds_pass(rounds_run, 3)  # nobody consumed the topic yet: nothing may go
            with PullConsumer(address, "fast", "Drained", batch_size=500, hold_ms=200) as fast:
                got = poll_until(fast, 200, 20)
                assert [r.body for r in got] == [m.body for m in early]
                fast.commit()
                n = 200
                for start in range(0, 4096, 128):  # 4 MiB: four times the store's bounds
                    batch = [
                        OutgoingMessage("Drained", b"drain%04d" % i + body) for i in range(start, start + 128)
                    ]
                    _send_through_pushback(producer, batch, deadline)
                    got = poll_until(fast, 128, 20)
                    assert [r.body for r in got] == [m.body for m in batch]
                    fast.commit()
                    n += 128
                with Admin(address) as admin:
                    admin.commit_offset("slow", "Drained", 0, n)  # a second group, at the end
                late = [OutgoingMessage("Drained", b"late%04d" % i + body) for i in range(100)]
                _send_through_pushback(producer, late, deadline)
                assert [r.body for r in poll_until(fast, 100, 20)] == [m.body for m in late]
                fast.commit()
        _release_rounds_pass(rounds_run, 3)  # "fast" read them; "slow" has not: nothing may go
        with PullConsumer(address, "slow", "Drained", batch_size=500, hold_ms=200) as slow:
            assert [r.body for r in poll_until(slow, 100, 20)] == [m.body for m in late]
            assert slow.skipped == {0: 0}
            slow.commit()
        if cluster is None:  # both groups read everything: the store holds only the unread one
            assert suite.commit_log is not None and suite.commit_log.transient is not None
            held = suite.commit_log.transient
            wait_until(lambda: len(held) == 1, "the release of what both groups read")
        else:  # the dispatch process counts what the commitlog process freed for it
            freed = _release_count(None, cluster, "messages")
            wait_until(lambda: freed() >= n + len(late), "the release of what both groups read")
            assert freed() == n + len(late)
        with PullConsumer(address, "late", "Unread") as reader:
            assert [r.body for r in poll_until(reader, 1, 20)] == [b"nobody reads me yet"]
    finally:
        if cluster is not None:
            cluster.stop_all()
        else:
            suites.stop(suite)


def test_a_restarted_dispatch_service_keeps_the_transient_messages_nobody_consumed(tmp_path: Path) -> None:
    """Split topology: the commitlog keeps running while dispatch restarts past the stubs it
    had noted (from its checkpoint); it must still hold them for the consumers to come."""
    cluster = SplitCluster(tmp_path / "split", role_args=_SPLIT_METRICS)
    cluster.start_all()
    try:
        with Admin(cluster.gateway) as admin:
            admin.create_topic("Kept", 1, durability="transient")
        early = [OutgoingMessage("Kept", b"early%04d" % i) for i in range(200)]
        with Producer(cluster.gateway, retries=0) as producer:
            assert producer.send_batch(early).all_ok
        _release_rounds_pass(_release_count(None, cluster), 2)  # rounds that noted the stubs
        assert cluster.procs["dispatch"].terminate() == 0
        cluster.start("dispatch")
        cluster.wait_serving()
        _release_rounds_pass(_release_count(None, cluster), 3)  # rounds of the new process
        with PullConsumer(cluster.gateway, "late", "Kept", batch_size=500, hold_ms=200) as consumer:
            got = poll_until(consumer, 200, 20)
            assert [r.body for r in got] == [m.body for m in early] and consumer.skipped == {0: 0}
    finally:
        cluster.stop_all()
