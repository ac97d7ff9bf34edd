"""The official Apache RocketMQ 5 Python client (rocketmq-python-client 5.1.2) against the gateway's
apache.rocketmq.v2 MessagingService, unchanged: each scenario runs the client in its own process
(tests/rocketmq/client_driver.py) against a real gateway on 127.0.0.1."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from libstore import TopicNotFoundError
from services.client import Admin, PullConsumer
from services.serve import Suite
from tests.rocketmq.harness import finish_driver, run_driver, start_driver
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites, SplitCluster, wait_until

pytestmark = pytest.mark.rocketmq

# Check-backs within seconds instead of RocketMQ's 6 s timeout and 30 s interval, and push
# deliveries hidden for 3 s per renewal instead of 60 s.
FAST_CHECKS = {
    "transaction_timeout": 1000,
    "transaction_check_interval": 2000,
    "default_invisible_time": 3000,
    "renew_ahead_time": 1500,
}


@pytest.fixture(scope="module", params=["embedded", "split"])
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The gateway address of an embedded suite (in this process) or of a split cluster (four
    processes), shared by the module's tests (each uses its own topics and groups)."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "embedded":
        suites = InProcessSuites()
        try:
            suite = suites.start(embedded_options(root / "data", **FAST_CHECKS))
            suites.wait_ready(suite)
            yield suite.address
        finally:
            suites.close()
    else:
        cluster = SplitCluster(root / "split", store=FAST_CHECKS)
        try:
            cluster.start_all()
            yield cluster.gateway
        finally:
            cluster.stop_all()


def _setup(address: str, topic: str, *, queues: int = 4, message_type: str = "NORMAL") -> None:
    with Admin(address) as admin:
        admin.create_topic(topic, queues, message_type=message_type)


def test_producer_send_and_simple_consumer_ack(broker: str, tmp_path: Path) -> None:
    addr = broker
    _setup(addr, "Orders")
    specs = [{"body": f"order-{i}", "tag": "paid" if i % 2 else "new", "keys": [f"k{i}"]} for i in range(10)]
    sync = run_driver("send", {"endpoint": addr, "topic": "Orders", "messages": specs[:5]}, tmp_path / "p1")
    asyn = run_driver(
        "send", {"endpoint": addr, "topic": "Orders", "messages": specs[5:], "async": True}, tmp_path / "p2"
    )
    assert not sync["errors"] and not asyn["errors"]
    sent = sync["ids"] + asyn["ids"]
    assert len(set(sent)) == 10

    got = run_driver(
        "simple",
        {"endpoint": addr, "group": "billing", "topic": "Orders", "expect": 10, "final_empty": True},
        tmp_path / "c1",
    )
    msgs = got["messages"]
    assert sorted(m["id"] for m in msgs) == sorted(sent)  # each once
    assert all(m["acked"] and m["attempt"] == 1 and not m["corrupted"] for m in msgs)
    by_body = {m["body"]: m for m in msgs}
    assert by_body["order-3"]["tag"] == "paid" and by_body["order-3"]["keys"] == ["k3"]
    assert got["final"] == []  # acked: nothing comes back

    # A tag filter: another group sees only its tag, from the start of the queues.
    paid = run_driver(
        "simple",
        {
            "endpoint": addr,
            "group": "audit",
            "topic": "Orders",
            "expr": "paid",
            "expect": 5,
            "final_empty": True,
        },
        tmp_path / "c2",
    )
    assert sorted(m["body"] for m in paid["messages"]) == sorted(f"order-{i}" for i in range(1, 10, 2))
    assert paid["final"] == []
    # The store's own view: the group's consumer offsets reached the end of every queue.
    with Admin(addr) as admin:
        progress = admin.consumer_progress("billing", "Orders")
    assert progress.total_lag == 0 and all(q.committed_offset == q.max_offset for q in progress.queues)


def test_change_invisible_duration_redelivers_with_next_attempt(broker: str, tmp_path: Path) -> None:
    addr = broker
    _setup(addr, "Jobs", queues=2)
    sent = run_driver(
        "send", {"endpoint": addr, "topic": "Jobs", "messages": [{"body": "j1"}]}, tmp_path / "p"
    )
    got = run_driver(
        "simple",
        # the first delivery is made invisible for 1 s instead of acked; it comes back
        {
            "endpoint": addr,
            "group": "workers",
            "topic": "Jobs",
            "expect": 2,
            "change_first_s": 1,
            "await_s": 3,
        },
        tmp_path / "c",
    )
    assert got["changed"] == sent["ids"][0] and got["handle_replaced"]
    first, second = got["messages"]
    assert first["id"] == second["id"] == sent["ids"][0]
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert second["acked"]


def test_unknown_topic_is_refused(broker: str, tmp_path: Path) -> None:
    sent = run_driver(
        "send",
        {"endpoint": broker, "topic": "NoSuchTopic", "messages": [{"body": "x"}]},
        tmp_path / "p",
    )
    assert sent["ids"] == [] and "route" in sent["errors"][0]


def test_push_consumer_failures_are_redelivered_then_dead_lettered(broker: str, tmp_path: Path) -> None:
    addr = broker
    _setup(addr, "Events", queues=2)
    with Admin(addr) as admin:
        admin.upsert_group("handlers", retry_max_times=2)  # 3 deliveries, then %DLQ%handlers
    bodies = [f"e{i}" for i in range(6)]
    sent = run_driver(
        "send",
        {"endpoint": addr, "topic": "Events", "messages": [{"body": b} for b in bodies]},
        tmp_path / "p",
    )
    # e2 always fails: delivered 3 times (attempts 1, 2, 3, the client nacks with its back-off of
    # 1 s then 5 s), then moved to the DLQ. The others succeed once.
    result = run_driver(
        "push",
        {
            "endpoint": addr,
            "group": "handlers",
            "topic": "Events",
            "fail": ["e2"],
            "expect": 8,
            "timeout_s": 40,
        },
        tmp_path / "c",
        timeout_s=90,
    )
    deliveries = result["deliveries"]
    failing = [d for d in deliveries if d["body"] == "e2"]
    assert [d["attempt"] for d in failing] == [1, 2, 3]
    others = sorted(d["body"] for d in deliveries if d["body"] != "e2")
    assert others == [b for b in bodies if b != "e2"]

    e2_id = sent["ids"][2]
    deadline = time.monotonic() + 30  # the last nack hides it for 10 s
    dlq = []
    while not dlq and time.monotonic() < deadline:
        try:
            with PullConsumer(addr, "dlq-reader", "%DLQ%handlers") as pull:
                dlq = pull.poll(2000)
        except TopicNotFoundError:  # the DLQ topic is created by the first forward
            time.sleep(0.5)
    assert [m.body for m in dlq] == [b"e2"]
    assert dlq[0].properties["DLQ_ORIGIN_TOPIC"] == "Events"
    assert dlq[0].properties["DLQ_ORIGIN_MESSAGE_ID"] == e2_id


def test_push_delivery_is_renewed_while_the_listener_works(broker: str, tmp_path: Path) -> None:
    """A push delivery is hidden for defaultInvisibleTimeMills (3 s here) and renewed while the
    client is connected: a listener that takes 8 s gets the message once, and its ack (with the
    handle it received) is taken."""
    addr = broker
    _setup(addr, "Reports", queues=2)
    sent = run_driver(
        "send",
        {"endpoint": addr, "topic": "Reports", "messages": [{"body": "slow"}, {"body": "quick"}]},
        tmp_path / "p",
    )
    result = run_driver(
        "push",
        {
            "endpoint": addr,
            "group": "renderers",
            "topic": "Reports",
            "slow": ["slow"],
            "slow_s": 8,
            "expect": 2,
            "linger_s": 6,  # a lost renewal or ack would show as a redelivery meanwhile
        },
        tmp_path / "c",
        timeout_s=90,
    )
    deliveries = result["deliveries"]
    assert sorted(d["body"] for d in deliveries) == ["quick", "slow"]
    assert all(d["attempt"] == 1 for d in deliveries)
    with Admin(addr) as admin:  # both acked: nothing left for the group
        assert admin.consumer_progress("renderers", "Reports").total_lag == 0
    assert sorted(sent["ids"]) == sorted(d["id"] for d in deliveries)


def _wait_progress(path: Path, at_least: int, proc: object, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if int(path.read_text() or 0) >= at_least:
                return
        except (OSError, ValueError):
            pass
        assert proc.poll() is None, "the consumer ended early"  # type: ignore[attr-defined]
        time.sleep(0.1)
    raise AssertionError(f"the consumer did not ack {at_least} messages in {timeout_s} s")


@pytest.mark.crash
@pytest.mark.slow
def test_ten_thousand_messages_exactly_once_across_gateway_and_dispatch_kills(
    split: SplitCluster, tmp_path: Path
) -> None:
    """10,000 messages through the official Producer; a SimpleConsumer group acks each. The
    gateway is SIGKILLed and restarted after ~3,000 acks, the dispatch service (which keeps the
    pop state) after ~6,000: every message is acked exactly once, and only messages whose
    delivery was not acked come again."""
    addr = split.gateway
    _setup(addr, "Bulk", queues=8)
    sent = run_driver(
        "send_many", {"endpoint": addr, "topic": "Bulk", "count": 10_000, "size": 1024}, tmp_path / "p", 300
    )
    assert not sent["errors"] and len(set(sent["ids"])) == 10_000
    progress = tmp_path / "progress"
    consumer = start_driver(
        "consume_many",
        {
            "endpoint": addr,
            "group": "bulk-readers",
            "topic": "Bulk",
            "expect": 10_000,
            "invisible_s": 5,
            "timeout_s": 240,
            "progress_file": str(progress),
        },
        tmp_path / "c",
    )
    try:
        _wait_progress(progress, 3_000, consumer)
        split.procs["gateway"].kill()
        time.sleep(1.0)
        split.start("gateway")
        _wait_progress(progress, 6_000, consumer)
        split.procs["dispatch"].kill()
        time.sleep(1.0)
        split.start("dispatch")
        result = finish_driver(consumer, timeout_s=300)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    confirmed: dict[str, int] = {}
    delivered_after_ack = []
    for msg_id, _attempt, ok in result["deliveries"]:
        if msg_id in confirmed:
            delivered_after_ack.append(msg_id)
        if ok:
            confirmed[msg_id] = confirmed.get(msg_id, 0) + 1
    delivered = {d[0] for d in result["deliveries"]}
    missing = set(sent["ids"]) - delivered
    assert not missing, f"{len(missing)} never delivered in {result['seconds']:.0f} s: {sorted(missing)[:5]}"
    assert max(confirmed.values()) == 1  # nothing acked twice
    assert delivered_after_ack == []  # an acked message never came back
    # Every message is finished for the group in the store, including those whose ack reply
    # was lost with the gateway (the ack was applied; the client could not know).
    with Admin(addr) as admin:
        progress = admin.consumer_progress("bulk-readers", "Bulk")
    assert progress.total_lag == 0
    assert result["errors"] > 0  # the consumer felt the gateway outage (its calls failed meanwhile)


def test_fifo_messages_of_a_group_arrive_in_order_one_at_a_time(broker: str, tmp_path: Path) -> None:
    addr = broker
    _setup(addr, "Ledger", queues=4, message_type="FIFO")
    with Admin(addr) as admin:
        admin.upsert_group("ledger-fifo", orderly=True)
    specs = [{"body": f"{g}-{i}", "group": g} for i in range(8) for g in ("acct1", "acct2", "acct3")]
    sent = run_driver("send", {"endpoint": addr, "topic": "Ledger", "messages": specs}, tmp_path / "p")
    assert not sent["errors"]
    # acct2-3 fails once: in FIFO mode nothing after it in acct2 may be consumed before its retry
    result = run_driver(
        "push",
        {"endpoint": addr, "group": "ledger-fifo", "topic": "Ledger", "fail_once": ["acct2-3"], "expect": 25},
        tmp_path / "c",
        timeout_s=90,
    )
    per_group: dict[str, list[str]] = {}
    for d in result["deliveries"]:
        assert d["group"] == d["body"].split("-")[0]
        per_group.setdefault(d["group"], []).append(d["body"])
    for g in ("acct1", "acct3"):
        assert per_group[g] == [f"{g}-{i}" for i in range(8)]
    expected = [f"acct2-{i}" for i in range(4)] + ["acct2-3"] + [f"acct2-{i}" for i in range(4, 8)]
    assert per_group["acct2"] == expected


@pytest.fixture
def default_suite(tmp_path: Path) -> Iterator[Suite]:
    """An embedded suite with the store's default timings (60 s invisible time, receives hidden
    for at least 10 s)."""
    suites = InProcessSuites()
    try:
        suite = suites.start(embedded_options(tmp_path / "data", minInvisibleTimeMillsForRecv=10_000))
        suites.wait_ready(suite)
        yield suite
    finally:
        suites.close()


@pytest.fixture
def default_broker(default_suite: Suite) -> str:
    return default_suite.address


def test_a_fifo_backlog_drains_as_fast_as_the_consumer_acks(default_broker: str, tmp_path: Path) -> None:
    """100 messages of one message group: a receive takes a run of them in order and blocks
    the group until they are acked; the receive the FIFO push consumer keeps parked meanwhile
    is woken by the ack that unblocks it (it used to sleep out its long-polling hold: ~20 s
    of nothing after every 32 messages)."""
    addr = default_broker
    _setup(addr, "Backlog", queues=1, message_type="FIFO")
    with Admin(addr) as admin:
        admin.upsert_group("backlog-fifo", orderly=True)
    specs = [{"body": f"b-{i}", "group": "one"} for i in range(100)]
    sent = run_driver("send", {"endpoint": addr, "topic": "Backlog", "messages": specs}, tmp_path / "p")
    assert not sent["errors"]
    result = run_driver(
        "push",
        {"endpoint": addr, "group": "backlog-fifo", "topic": "Backlog", "expect": 100, "timeout_s": 90},
        tmp_path / "c",
        timeout_s=120,
    )
    deliveries = result["deliveries"]
    assert [d["body"] for d in deliveries] == [f"b-{i}" for i in range(100)]
    gaps = [b["received_ms"] - a["received_ms"] for a, b in itertools.pairwise(deliveries)]
    assert max(gaps) < 10_000, f"a delivery waited {max(gaps)} ms for the previous ack to wake it"


def test_delay_message_is_delivered_no_earlier_than_its_timestamp(broker: str, tmp_path: Path) -> None:
    addr = broker
    _setup(addr, "Later", queues=2, message_type="DELAY")
    deliver_at_s = int(time.time()) + 3
    sent = run_driver(
        "send",
        {
            "endpoint": addr,
            "topic": "Later",
            "messages": [{"body": "wake-up", "deliver_at_s": deliver_at_s, "tag": "alarm"}],
        },
        tmp_path / "p",
    )
    assert not sent["errors"]
    got = run_driver(
        "simple",
        {"endpoint": addr, "group": "sleepers", "topic": "Later", "expect": 1, "await_s": 5, "timeout_s": 30},
        tmp_path / "c",
    )
    (msg,) = got["messages"]
    assert msg["id"] == sent["ids"][0] and msg["body"] == "wake-up" and msg["tag"] == "alarm"
    assert msg["received_ms"] >= deliver_at_s * 1000
    assert msg["received_ms"] < deliver_at_s * 1000 + 5000  # the timer delivered it within seconds


def test_transactions_commit_rollback_and_check_back(broker: str, tmp_path: Path) -> None:
    """Commit makes the half message visible, rollback drops it; an open one is checked back
    over the producer's Telemetry stream and the checker's COMMIT delivers it."""
    addr = broker
    _setup(addr, "Payments", queues=2, message_type="TRANSACTION")
    result = run_driver(
        "transaction",
        {
            "endpoint": addr,
            "topic": "Payments",
            "messages": [
                {"body": "committed", "action": "commit"},
                {"body": "rolled-back", "action": "rollback"},
                {"body": "checked", "action": "check"},
            ],
            "check_answer": "commit",
            "expect_checks": 1,
            "wait_checks_s": 20,
        },
        tmp_path / "p",
    )
    committed, rolled_back, checked = result["ids"]
    assert result["checks"] == [checked]  # only the open one was checked, once
    got = run_driver(
        "simple",
        {
            "endpoint": addr,
            "group": "accounting",
            "topic": "Payments",
            "expect": 2,
            "await_s": 3,
            "timeout_s": 20,
            "final_empty": True,
        },
        tmp_path / "c",
    )
    assert sorted(m["id"] for m in got["messages"]) == sorted([committed, checked])
    assert got["final"] == [] and rolled_back not in {m["id"] for m in got["messages"]}


def test_receive_invisible_time_outside_the_proxy_bounds_is_refused(
    default_broker: str, tmp_path: Path
) -> None:
    """ILLEGAL_INVISIBLE_TIME below minInvisibleTimeMillsForRecv (10 s) and above
    maxInvisibleTimeMills (12 h), as RocketMQ's proxy answers; in bounds the message comes."""
    addr = default_broker
    _setup(addr, "Bounded", queues=1)
    sent = run_driver(
        "send", {"endpoint": addr, "topic": "Bounded", "messages": [{"body": "x"}]}, tmp_path / "p"
    )
    args = {"endpoint": addr, "group": "bounded", "topic": "Bounded"}
    short = run_driver("receive_once", {**args, "invisible_s": 5}, tmp_path / "c1")
    assert "40011" in short["error"] or "ILLEGAL_INVISIBLE_TIME" in short["error"], short
    assert "too small" in short["error"]
    long = run_driver("receive_once", {**args, "invisible_s": 13 * 3600}, tmp_path / "c2")
    assert "too large" in long["error"], long
    fine = run_driver("receive_once", {**args, "invisible_s": 10}, tmp_path / "c3")
    assert fine["ids"] == sent["ids"]


@pytest.mark.crash
def test_a_push_consumer_that_dies_holding_a_message_releases_it_at_once(
    default_suite: Suite, tmp_path: Path
) -> None:
    """A push consumer killed while its listener works on a message: its Telemetry stream
    closes, the gateway makes the message visible again after invisibleTimeMillisWhenClear (1 s)
    instead of the rest of its 60 s, and another consumer of the group gets it (attempt 2)."""
    addr = default_suite.address
    assert default_suite.messaging is not None
    renewer = default_suite.messaging.ctx.renewer
    _setup(addr, "Held", queues=1)
    sent = run_driver(
        "send", {"endpoint": addr, "topic": "Held", "messages": [{"body": "held"}]}, tmp_path / "p"
    )
    holder = start_driver(
        "push",
        {"endpoint": addr, "group": "holders", "topic": "Held", "expect": 1, "slow": ["held"], "slow_s": 300},
        tmp_path / "c1",
    )
    try:
        wait_until(lambda: len(renewer) == 1, "the push consumer to hold the message", timeout_s=60)
    finally:
        holder.kill()
        holder.communicate()
    got = run_driver(
        "simple",
        {
            "endpoint": addr,
            "group": "holders",
            "topic": "Held",
            "expect": 1,
            "timeout_s": 20,
            "invisible_s": 30,
        },
        tmp_path / "c2",
    )
    assert [(m["id"], m["attempt"]) for m in got["messages"]] == [(sent["ids"][0], 2)]
    assert len(renewer) == 0


def test_a_new_group_starts_at_the_latest_message_unless_told_earliest(tmp_path: Path) -> None:
    """RocketMQ's proxy pops a group without an offset from the queue's last message
    (ConsumeInitMode.MAX), except in a queue young enough that its first message is still in
    memory; ``consume_from="earliest"`` takes the whole history. With no record counted in
    memory (accessMessageInMemoryMaxRatio 0) the queue here is old."""
    suites = InProcessSuites()
    try:
        suite = suites.start(embedded_options(tmp_path / "data", accessMessageInMemoryMaxRatio=0))
        suites.wait_ready(suite)
        addr = suite.address
        _setup(addr, "History", queues=1)
        with Admin(addr) as admin:
            assert admin.upsert_group("from-start", consume_from="earliest").consume_from == "earliest"
        specs = [{"body": f"m-{i}"} for i in range(10)]
        sent = run_driver("send", {"endpoint": addr, "topic": "History", "messages": specs}, tmp_path / "p")
        args = {"endpoint": addr, "topic": "History", "invisible_s": 30}
        latest = run_driver("receive_once", {**args, "group": "from-now"}, tmp_path / "c1")
        assert latest["ids"] == sent["ids"][-1:]
        earliest = run_driver("receive_once", {**args, "group": "from-start"}, tmp_path / "c2")
        assert sorted(earliest["ids"]) == sorted(sent["ids"])
        # The start is kept: the next receive of the latest group gets what came after it.
        more = run_driver(
            "send", {"endpoint": addr, "topic": "History", "messages": [{"body": "m-10"}]}, tmp_path / "p2"
        )
        after = run_driver("receive_once", {**args, "group": "from-now"}, tmp_path / "c3")
        assert after["ids"] == more["ids"]
    finally:
        suites.close()


def test_an_orphaned_transaction_is_counted_and_dropped_without_a_producer(tmp_path: Path) -> None:
    """A producer sends a half message and goes away: no gateway has a producer of the topic to
    ask, yet every check round counts, so transactionCheckMax (2 here) ends it: dropped, never
    delivered. It used to wait unresolved for ever."""
    store = {"transaction_timeout": 1000, "transaction_check_interval": 1000, "transaction_check_max": 2}
    suites = InProcessSuites()
    try:
        suite = suites.start(embedded_options(tmp_path / "data", **store))
        suites.wait_ready(suite)
        addr = suite.address
        assert suite.dispatch_app is not None
        transactions = suite.dispatch_app.transactions
        _setup(addr, "Orphans", queues=1, message_type="TRANSACTION")
        sent = run_driver(
            "transaction",
            {"endpoint": addr, "topic": "Orphans", "messages": [{"body": "left open", "action": "check"}]},
            tmp_path / "p",
        )
        assert len(sent["ids"]) == 1 and sent["checks"] == []
        wait_until(lambda: len(transactions.pending) == 1, "the half message to be listed")
        (half,) = transactions.pending.values()
        wait_until(lambda: not transactions.pending, "the orphan to be dropped", timeout_s=30)
        assert half.checks == 2  # counted each round, then dropped past transactionCheckMax
        got = run_driver(
            "simple",
            {"endpoint": addr, "group": "orphan-readers", "topic": "Orphans", "expect": 1, "timeout_s": 4},
            tmp_path / "c",
        )
        assert got["messages"] == []
    finally:
        suites.close()


def test_resource_namespaces_isolate_topics_and_groups(broker: str, tmp_path: Path) -> None:
    """A producer and a consumer in namespace nsA use topic T1 and group G1: the store keeps
    them as nsA%T1 and nsA%G1 (RocketMQ's mapping), so clients without a namespace, using the
    same names, never see their messages, and the nsA consumer sees the names it used."""
    addr = broker
    _setup(addr, "nsA%T1", queues=1)
    _setup(addr, "T1", queues=1)
    ns = {"endpoint": addr, "topic": "T1", "namespace": "nsA"}
    plain = {"endpoint": addr, "topic": "T1"}
    in_ns = run_driver("send", {**ns, "messages": [{"body": "in nsA"}]}, tmp_path / "p1")
    outside = run_driver("send", {**plain, "messages": [{"body": "no namespace"}]}, tmp_path / "p2")
    assert not in_ns["errors"] and not outside["errors"]
    got_ns = run_driver(
        "simple", {**ns, "group": "G1", "expect": 1, "timeout_s": 10, "final_empty": True}, tmp_path / "c1"
    )
    got_plain = run_driver(
        "simple", {**plain, "group": "G1", "expect": 1, "timeout_s": 10, "final_empty": True}, tmp_path / "c2"
    )
    assert [(m["body"], m["topic"], m["namespace"]) for m in got_ns["messages"]] == [("in nsA", "T1", "nsA")]
    assert got_ns["final"] == [] and got_plain["final"] == []
    assert [(m["body"], m["topic"]) for m in got_plain["messages"]] == [("no namespace", "T1")]
    with PullConsumer(addr, "own-api", "nsA%T1", hold_ms=200) as consumer:  # the store's own name
        seen = []
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            seen += consumer.poll(500)
    assert [m.body for m in seen] == [b"in nsA"]
