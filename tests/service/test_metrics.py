"""The Prometheus scrape endpoint (``mqstore serve --metrics-listen``): scraped over HTTP after real
produces and pulls, parsed as Prometheus parses the text format. The embedded suite runs in this
process (its counters are the process's: each test uses topics and groups of its own); the split
topology runs one endpoint per service process."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.client import Admin, OutgoingMessage, Producer, PullConsumer
from services.serve import ServeOptions
from tests.service.harness import (
    SMALL_STORE,
    InProcessSuites,
    ServeProcess,
    SplitCluster,
    poll_until,
    scrape,
    value,
    wait_until,
)


def test_embedded_suite_serves_put_get_lag_and_store_metrics(tmp_path: Path) -> None:
    suites = InProcessSuites()
    try:
        options = ServeOptions(
            role="embedded",
            data_dir=tmp_path / "data",
            listen="127.0.0.1:0",
            store=SMALL_STORE,
            metrics_listen="127.0.0.1:0",
        )
        suite = suites.start(options)
        suites.wait_ready(suite)
        assert suite.metrics is not None
        topic, group = "MetricsOrders", "metrics-billing"
        with Admin(suite.address) as admin:
            admin.create_topic(topic, 1)
        with Producer(suite.address) as producer:
            producer.send_batch([OutgoingMessage(topic, b"x" * 100) for _ in range(3)])
            producer.send(topic, b"y" * 10)
        with PullConsumer(suite.address, group, topic, hold_ms=200) as consumer:
            assert len(poll_until(consumer, 4, 20)) == 4
        with Admin(suite.address) as admin:
            admin.commit_offset(group, topic, 0, 1)  # three of the four still to consume
            admin.create_topic("MetricsEphemeral", 1, durability="transient")
        with Producer(suite.address) as producer:  # held in memory until consumed (libstore.durability)
            assert producer.send_batch(
                [OutgoingMessage("MetricsEphemeral", b"t" * 100) for _ in range(5)]
            ).all_ok

        address = suite.metrics.address

        def followers_caught_up() -> bool:  # the reput threads tail the log on their own time
            samples = scrape(address)
            return all(
                value(samples, "mqstore_dispatch_lag_bytes", follower=f) == 0 for f in ("dispatch", "index")
            )

        wait_until(followers_caught_up, "dispatch and index to reach the end of the log")
        samples = scrape(address)
        assert value(samples, "mqstore_put_messages_total", topic=topic) == 4
        put_bytes = value(samples, "mqstore_put_bytes_total", topic=topic)
        assert 3 * 100 + 10 < put_bytes < 4 * 400  # whole records: headers and properties too
        assert value(samples, "mqstore_put_latency_milliseconds_count", topic=topic) == 2  # two calls
        assert value(samples, "mqstore_put_latency_milliseconds_sum", topic=topic) > 0
        assert value(samples, "mqstore_get_messages_total", topic=topic, group=group) == 4
        assert value(samples, "mqstore_get_bytes_total", topic=topic, group=group) == put_bytes
        assert value(samples, "mqstore_get_latency_milliseconds_count", topic=topic) >= 1
        assert value(samples, "mqstore_consumer_lag", topic=topic, group=group) == 3
        for follower in ("dispatch", "index"):
            assert value(samples, "mqstore_dispatch_lag_bytes", follower=follower) == 0
            assert value(samples, "mqstore_dispatch_lag_time_milliseconds", follower=follower) == 0
        member = {"broker_name": "broker-a", "broker_id": "0"}
        end = value(samples, "mqstore_commitlog_max_offset_bytes", **member)
        assert end >= put_bytes and value(samples, "mqstore_commitlog_confirm_offset_bytes", **member) == end
        assert value(samples, "mqstore_commitlog_size_bytes", **member) == end  # nothing deleted yet
        assert value(samples, "mqstore_commitlog_writeable", **member) == 1
        assert value(samples, "mqstore_commitlog_role", role="ASYNC_MASTER", **member) == 1
        assert 0 < value(samples, "mqstore_disk_used_ratio", **member) < 1
        assert value(samples, "mqstore_transient_messages", **member) == 5
        assert 5 * 100 < value(samples, "mqstore_transient_memory_bytes", **member) < 5 * 400
        assert value(samples, "mqstore_transient_scratch_bytes", **member) == 0  # nothing paged out
        assert value(samples, "mqstore_transient_refused_total", **member) == 0
        assert "process_cpu_seconds_total" in samples  # prometheus_client's process metrics
    finally:
        suites.close()
    with pytest.raises(OSError):
        scrape(address)  # the endpoint closed with the suite


def test_split_services_each_serve_their_own_metrics(tmp_path: Path) -> None:
    """Four processes, four endpoints: the commitlog counts what was put, the gateway what
    consumers got, the dispatch service its consumers' lag, both followers their dispatch lag."""
    roles = ("commitlog", "dispatch", "index", "gateway")
    cluster = SplitCluster(
        tmp_path / "split",
        store={"autoCreateTopicEnable": "true"},
        role_args={role: ["--metrics-listen", "127.0.0.1:0"] for role in roles},
    )
    try:
        cluster.start_all()
        metrics = {role: cluster.procs[role].metrics_address() for role in roles}
        topic, group = "SplitMetrics", "split-group"
        with Producer(cluster.gateway) as producer:
            producer.send_batch([OutgoingMessage(topic, b"z" * 50, queue_id=0) for _ in range(5)])
        with PullConsumer(cluster.gateway, group, topic, hold_ms=200, queues=[0]) as consumer:
            assert len(poll_until(consumer, 5, 20)) == 5
            consumer.commit()
        assert value(scrape(metrics["commitlog"]), "mqstore_put_messages_total", topic=topic) == 5
        assert value(scrape(metrics["gateway"]), "mqstore_get_messages_total", topic=topic, group=group) == 5
        assert value(scrape(metrics["dispatch"]), "mqstore_consumer_lag", topic=topic, group=group) == 0
        for follower in ("dispatch", "index"):  # the index service tails the log on its own time
            wait_until(
                lambda f=follower: value(scrape(metrics[f]), "mqstore_dispatch_lag_bytes", follower=f) == 0,
                f"the {follower} service to reach the end of the log",
            )
        assert "mqstore_put_messages_total" not in scrape(metrics["gateway"])  # each process its own
    finally:
        cluster.stop_all()


def test_a_bad_metrics_address_is_a_clear_error(tmp_path: Path) -> None:
    log = tmp_path / "bad.log"
    proc = ServeProcess(
        ["--data", str(tmp_path / "d"), "--listen", "127.0.0.1:0", "--metrics-listen", "nowhere"], log=log
    )
    assert proc.proc.wait(30) != 0
    proc.kill()
    assert "--metrics-listen takes host:port" in log.read_text()
