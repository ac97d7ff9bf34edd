"""OpenTelemetry across services: the split topology's four services run in this process (wired
over gRPC, as four processes would be) so one in-memory exporter sees every span; one produce
must be one trace gateway → commitlog, one pull one trace gateway → dispatch → commitlog; a
message's send is linked from everything that handles it later, a consumer in another process
(exporting over OTLP to a receiver in this test) included."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_service_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_service_grpc
from opentelemetry.proto.trace.v1 import trace_pb2 as otlp_trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from services._common.telemetry import add_span_exporter
from services.client import Admin, Producer
from services.proto import gateway_grpc, gateway_pb
from services.serve import ServeOptions
from tests.rocketmq.harness import run_driver
from tests.service.harness import REPO, SMALL_STORE, InProcessSuites


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    exp = InMemorySpanExporter()
    add_span_exporter(exp)
    return exp


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

    addr: dict[str, str] = {}
    for name, role in (("master", "SYNC_MASTER"), ("slave", "SLAVE")):
        suite = suites.start(
            ServeOptions(
                role="commitlog",
                data_dir=tmp_path / name,
                listen="127.0.0.1:0",
                ha_listen="127.0.0.1:0",
                store={
                    **SMALL_STORE,
                    "autoCreateTopicEnable": "true",  # off by default for the commitlog role
                    "brokerRole": role,
                    "brokerId": 0 if name == "master" else 1,
                    "haMasterAddress": addr.get("master-ha", ""),
                },
            )
        )
        assert suite.ha_server is not None
        addr[name], addr[f"{name}-ha"] = suite.address, suite.ha_server.address

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


class _Collector(trace_service_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver on 127.0.0.1: what another process's SDK exports."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []  # (service.name, opentelemetry.proto Span)
        self._lock = threading.Lock()

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._lock:
            for resource_spans in request.resource_spans:
                attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    self.spans += [(attrs.get("service.name", ""), s) for s in scope_spans.spans]
        return trace_service_pb.ExportTraceServiceResponse()

    def found(self, predicate: Callable[[str, Any], bool]) -> list[Any]:
        with self._lock:
            return [s for service, s in self.spans if predicate(service, s)]


@pytest.fixture
def collector() -> Iterator[tuple[str, _Collector]]:
    received = _Collector()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    trace_service_grpc.add_TraceServiceServicer_to_server(received, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", received
    server.stop(0)


CONSUMER_APP = """
import json, sys
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

collector, gateway, group, topic = sys.argv[1:5]
provider = TracerProvider(resource=Resource.create({"service.name": "consumer-app"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector, insecure=True)))
trace.set_tracer_provider(provider)
from services.client import PullConsumer  # an application's consumer, traced by its own SDK

got = []
with PullConsumer(gateway, group, topic, hold_ms=500) as consumer:
    for _ in range(60):
        got += consumer.poll(500)
        if got:
            break
provider.shutdown()
print(json.dumps([{"id": r.msg_id, "traceparent": r.properties.get("traceparent")} for r in got]))
"""


def test_a_message_is_one_picture_from_send_to_another_process_receive(
    exporter: InMemorySpanExporter, split_in_process: str, collector: tuple[str, _Collector], tmp_path: Path
):
    """The producer's send span is the parent of the store's spans (gateway, commitlog); the
    dispatch and index spans that applied the message, the gateway's pull and a consumer in
    another process (exporting over OTLP) link to it, through the traceparent the message
    carries."""
    gateway = split_in_process
    endpoint, received = collector
    topic, group = "Followed", "followers"
    with Admin(gateway) as admin:
        admin.create_topic(topic, 1)
    with Producer(gateway) as producer:
        sent = producer.send(topic, b"trace me", tags="t1", queue_id=0)
    assert sent.all_ok
    (publish,) = [s for s in exporter.get_finished_spans() if s.name == f"publish {topic}"]
    assert publish.kind == SpanKind.PRODUCER
    assert publish.attributes["messaging.destination.name"] == topic
    assert publish.attributes["messaging.message.id"] == sent[0].msg_id
    trace_id, send_id = publish.context.trace_id, publish.context.span_id

    def spans_named(name: str) -> Callable[[Any], list[Any]]:
        return lambda spans: [s for s in spans if s.name == name and s.context.trace_id == trace_id]

    (produce_rpc,) = _wait_for(exporter, spans_named("/mqstore.v1.Gateway/Produce"))
    assert produce_rpc.kind == SpanKind.SERVER and produce_rpc.parent.span_id == send_id
    assert _wait_for(exporter, spans_named("commitlog.append"))  # the store's spans: the send's trace

    def linked(name: str) -> Callable[[Any], list[Any]]:
        return lambda spans: [
            s
            for s in spans
            if s.name == name
            and any(ln.context.span_id == send_id and ln.context.trace_id == trace_id for ln in s.links)
        ]

    assert _wait_for(exporter, linked("dispatch.dispatch")), "the dispatch span does not link to the send"
    assert _wait_for(exporter, linked("index.dispatch")), "the index span does not link to the send"

    out = subprocess.run(
        [sys.executable, "-c", CONSUMER_APP, endpoint, gateway, group, topic],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (got,) = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["id"] == sent[0].msg_id
    assert got["traceparent"].startswith(f"00-{trace_id:032x}-{send_id:016x}-")  # carried in the message

    pulls = _wait_for(
        exporter, lambda spans: linked("gateway.pull_many")(spans) or linked("gateway.pull")(spans)
    )
    assert pulls and pulls[0].attributes["messaging.consumer.group.name"] == group
    receives = received.found(lambda service, s: service == "consumer-app" and s.name == f"receive {topic}")
    assert receives, f"the consumer exported no receive span: {[s.name for _, s in received.spans]}"
    (receive,) = receives
    assert receive.kind == otlp_trace.Span.SPAN_KIND_CONSUMER
    assert [(ln.trace_id, ln.span_id) for ln in receive.links] == [
        (trace_id.to_bytes(16, "big"), send_id.to_bytes(8, "big"))
    ]
    attrs = {a.key: a.value for a in receive.attributes}
    assert attrs["messaging.message.id"].string_value == sent[0].msg_id
    assert attrs["messaging.consumer.group.name"].string_value == group


@pytest.mark.rocketmq
def test_an_official_client_receive_links_to_the_send(
    exporter: InMemorySpanExporter, split_in_process: str, tmp_path: Path
):
    """RocketMQ 5's ReceiveMessage: the gateway's receive span links to the send of the message it
    delivers (the traceparent travels as the message's trace_context to the official client)."""
    gateway = split_in_process
    topic, group = "FollowedV2", "v2-followers"
    with Admin(gateway) as admin:
        admin.create_topic(topic, 1)
    with Producer(gateway) as producer:
        assert producer.send(topic, b"trace me too", queue_id=0).all_ok
    (publish,) = [s for s in exporter.get_finished_spans() if s.name == f"publish {topic}"]
    send = (publish.context.trace_id, publish.context.span_id)
    got = run_driver(
        "receive_many",
        {"endpoint": gateway, "topic": topic, "group": group, "count": 1, "idle_s": 1},
        tmp_path / "home",
    )
    assert got["acked"] == 1, got

    def linked_receives(spans: Any) -> list[Any]:
        return [
            s
            for s in spans
            if s.name == "gateway.v2.receive"
            and any((ln.context.trace_id, ln.context.span_id) == send for ln in s.links)
        ]

    (receive,) = _wait_for(exporter, linked_receives)
    assert receive.attributes["messaging.consumer.group.name"] == group
    assert receive.attributes["messaging.destination.name"] == topic
