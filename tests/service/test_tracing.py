"""OpenTelemetry across services: the split topology's four services run in this process (wired
over gRPC, as four processes would be) so one in-memory exporter sees every span; one produce
must be one trace gateway → commitlog, one pull one trace gateway → dispatch → commitlog."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from services._common.telemetry import add_span_exporter
from services.client import Admin, Producer
from services.proto import gateway_grpc, gateway_pb
from services.serve import ServeOptions
from tests.service.harness import SMALL_STORE, InProcessSuites, free_port


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    exp = InMemorySpanExporter()
    add_span_exporter(exp)
    return exp


@pytest.fixture
def split_in_process(suites: InProcessSuites, tmp_path: Path) -> str:
    ports = {role: free_port() for role in ("commitlog", "dispatch", "index", "gateway")}
    addr = {role: f"127.0.0.1:{port}" for role, port in ports.items()}
    for role in ("commitlog", "dispatch", "index", "gateway"):
        suite = suites.start(
            ServeOptions(
                role=role,
                data_dir=tmp_path / role,
                listen=addr[role],
                commitlog=addr["commitlog"],
                dispatch=addr["dispatch"],
                index=addr["index"],
                store=SMALL_STORE,
            )
        )
        suites.wait_ready(suite)
    return addr["gateway"]


def _wait_for(exporter: InMemorySpanExporter, predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        spans = exporter.get_finished_spans()
        found = predicate(spans)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_one_produce_is_one_trace_from_gateway_to_commitlog(
    exporter: InMemorySpanExporter, split_in_process: str
):
    gateway = split_in_process
    with Admin(gateway) as admin:
        admin.create_topic("Traced", 2)
    exporter.clear()
    with Producer(gateway) as producer:
        assert producer.send("Traced", b"follow me", queue_id=0).all_ok

    def produce_trace(spans):
        roots = [s for s in spans if s.name == "/mqstore.v1.Gateway/Produce" and s.kind == SpanKind.SERVER]
        if not roots:
            return None
        trace_id = roots[0].context.trace_id
        names = {(s.name, s.kind) for s in spans if s.context.trace_id == trace_id}
        want = {
            ("/mqstore.v1.Gateway/Produce", SpanKind.SERVER),
            ("gateway.produce", SpanKind.INTERNAL),
            ("/mqstore.v1.CommitLogService/Append", SpanKind.CLIENT),
            ("/mqstore.v1.CommitLogService/Append", SpanKind.SERVER),
            ("commitlog.append", SpanKind.INTERNAL),
        }
        return names if want <= names else None

    names = _wait_for(exporter, produce_trace)
    assert names, f"no single produce trace; spans: {[s.name for s in exporter.get_finished_spans()]}"


def test_one_pull_is_one_trace_through_dispatch_and_commitlog(
    exporter: InMemorySpanExporter, split_in_process: str
):
    gateway = split_in_process
    with Admin(gateway) as admin:
        admin.create_topic("Pulled", 1)  # the split topology does not auto-create topics
    with Producer(gateway) as producer:
        assert producer.send("Pulled", b"read me", queue_id=0).all_ok
    channel = grpc.insecure_channel(gateway)
    stub = gateway_grpc.GatewayStub(channel)
    deadline = time.monotonic() + 10
    while True:  # dispatch may lag a moment behind the append
        exporter.clear()
        reply = stub.Pull(
            gateway_pb.PullRequest(group="g", topic="Pulled", queue_id=0, offset=0, max_count=4), timeout=10
        )
        if reply.messages or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    channel.close()
    assert [m.body for m in reply.messages] == [b"read me"]

    def pull_trace(spans):
        roots = [s for s in spans if s.name == "/mqstore.v1.Gateway/Pull" and s.kind == SpanKind.SERVER]
        if not roots:
            return None
        trace_id = roots[-1].context.trace_id
        names = {(s.name, s.kind) for s in spans if s.context.trace_id == trace_id}
        want = {
            ("/mqstore.v1.Gateway/Pull", SpanKind.SERVER),
            ("/mqstore.v1.DispatchService/GetEntries", SpanKind.CLIENT),
            ("/mqstore.v1.DispatchService/GetEntries", SpanKind.SERVER),
            ("dispatch.get_entries", SpanKind.INTERNAL),
            ("/mqstore.v1.CommitLogService/Read", SpanKind.CLIENT),
            ("/mqstore.v1.CommitLogService/Read", SpanKind.SERVER),
            ("commitlog.read", SpanKind.INTERNAL),
        }
        return names if want <= names else None

    names = _wait_for(exporter, pull_trace)
    assert names, f"no single pull trace; spans: {sorted({s.name for s in exporter.get_finished_spans()})}"


def test_sync_master_wait_and_replication_lag_are_traced_and_measured(
    exporter: InMemorySpanExporter, suites: InProcessSuites, tmp_path: Path
):
    from libstore import Message, PutMessageStatus
    from services._common.remote import open_channel
    from services._common.telemetry import metrics_snapshot
    from services.commitlog.client import RemoteCommitLog

    ports = {name: free_port() for name in ("master", "master-ha", "slave", "slave-ha")}
    addr = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    for name, role in (("master", "SYNC_MASTER"), ("slave", "SLAVE")):
        suites.start(
            ServeOptions(
                role="commitlog",
                data_dir=tmp_path / name,
                listen=addr[name],
                ha_listen=addr[f"{name}-ha"],
                store={
                    **SMALL_STORE,
                    "autoCreateTopicEnable": "true",  # off by default for the commitlog role
                    "brokerRole": role,
                    "brokerId": 0 if name == "master" else 1,
                    "haMasterAddress": addr["master-ha"] if name == "slave" else "",
                },
            )
        )

    async def produce() -> tuple[object, object]:
        channel = open_channel(addr["master"])
        try:
            master = RemoteCommitLog(channel)
            for _ in range(200):
                state = await master.ha_state()
                if state.slaves and state.slaves[0].in_sync:
                    break
                await asyncio.sleep(0.05)
            results = await master.append([Message("Traced", b"replicated", 0)])
            return results, await master.ha_state()
        finally:
            await channel.close()

    results, state = suites.loop.run(produce())
    assert results.status is PutMessageStatus.PUT_OK
    waits = _wait_for(exporter, lambda spans: [s for s in spans if s.name == "commitlog.replica_wait"])
    assert waits and waits[-1].attributes["mqstore.status"] == "PUT_OK"
    assert state.replicated_offset == state.max_offset == results.next_offset
    metrics = metrics_snapshot()
    assert any(attrs.get("status") == "PUT_OK" for attrs, _ in metrics["mqstore.ha.sync_master_wait"])
    acked = [value for _, value in metrics["mqstore.ha.slave_ack_offset"]]
    assert results.next_offset in acked
    assert 0.0 in [value for _, value in metrics["mqstore.ha.replication_lag_bytes"]]
    assert "mqstore.ha.replication_lag_ms" in metrics and "mqstore.ha.master_lag_bytes" in metrics
