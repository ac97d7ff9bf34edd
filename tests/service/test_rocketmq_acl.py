"""Access control on the RocketMQ 5 protocol (services.gateway.rocketmq.acl), in both topologies:
the official client with valid keys is served, wrong or missing credentials get UNAUTHORIZED and
keys without the permission get FORBIDDEN, in the response status as the proxy answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from services.client import Admin
from services.credentials import Credentials
from services.gateway.rocketmq.pb import Code, definition, service, service_grpc
from tests.rocketmq.harness import run_driver
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites, SplitCluster, v2_signed

pytestmark = pytest.mark.rocketmq

ACL = """
accounts:
  - accessKey: shop-writer
    secretKey: writer-secret
    defaultTopicPerm: DENY
    topicPerms: [Secure=PUB]
  - accessKey: shop-reader
    secretKey: reader-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [Secure=SUB]
    groupPerms: [auditors=SUB]
  - accessKey: ops
    secretKey: ops-secret
    admin: true
"""
OPS = Credentials("ops", "ops-secret")


@pytest.fixture(scope="module", params=["embedded", "split"])
def secured(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp(f"acl-{request.param}")
    acl_file = root / "plain_acl.yml"
    acl_file.write_text(ACL)
    if request.param == "embedded":
        suites = InProcessSuites()
        try:
            options = embedded_options(root / "data")
            options.acl_file = acl_file
            suite = suites.start(options)
            suites.wait_ready(suite)
            yield suite.address
        finally:
            suites.close()
    else:
        cluster = SplitCluster(root / "split", gateway_args=["--acl-file", str(acl_file)])
        try:
            cluster.start_all()
            yield cluster.gateway
        finally:
            cluster.stop_all()


def test_official_client_with_keys_is_served_and_refused_without(secured: str, tmp_path: Path) -> None:
    addr = secured
    with Admin(addr, credentials=OPS) as admin:
        admin.create_topic("Secure", 2)
    ok = run_driver(
        "send",
        {
            "endpoint": addr,
            "topic": "Secure",
            "ak": "shop-writer",
            "sk": "writer-secret",
            "messages": [{"body": "a"}],
        },
        tmp_path / "p1",
    )
    assert not ok["errors"] and len(ok["ids"]) == 1
    wrong = run_driver(
        "send",
        {
            "endpoint": addr,
            "topic": "Secure",
            "ak": "shop-writer",
            "sk": "guess",
            "messages": [{"body": "b"}],
        },
        tmp_path / "p2",
    )
    assert wrong["ids"] == [] and wrong["errors"]
    reader_sends = run_driver(
        "send",
        {
            "endpoint": addr,
            "topic": "Secure",
            "ak": "shop-reader",
            "sk": "reader-secret",
            "messages": [{"body": "c"}],
        },
        tmp_path / "p3",
    )
    # The wrong secret is refused from the first call on (the route); the reader may read the
    # route but not publish.
    assert "route" in wrong["errors"][0]
    assert reader_sends["ids"] == [] and reader_sends["errors"][0].startswith("ForbiddenException: 40300")
    got = run_driver(
        "simple",
        {
            "endpoint": addr,
            "topic": "Secure",
            "group": "auditors",
            "ak": "shop-reader",
            "sk": "reader-secret",
            "expect": 1,
            "final_empty": True,
        },
        tmp_path / "c",
    )
    assert [m["id"] for m in got["messages"]] == ok["ids"] and got["messages"][0]["acked"]
    assert got["final"] == []  # b and c were never stored


def test_status_codes_for_each_refusal(secured: str) -> None:
    addr = secured
    with Admin(addr, credentials=OPS) as admin:
        admin.create_topic("Secure", 2)
    topic = definition.Resource(name="Secure")
    message = definition.Message(
        topic=topic,
        body=b"x",
        system_properties=definition.SystemProperties(message_id="01AC0000000000000000000000000001"),
    )
    receive = service.ReceiveMessageRequest(
        group=definition.Resource(name="auditors"),
        message_queue=definition.MessageQueue(topic=topic, id=-1),
        filter_expression=definition.FilterExpression(type=definition.TAG, expression="*"),
        batch_size=1,
        long_polling_timeout=Duration(seconds=0),
    )
    with grpc.insecure_channel(addr) as channel:
        stub = service_grpc.MessagingServiceStub(channel)

        def send(metadata: list[tuple[str, str]]) -> int:
            reply = stub.SendMessage(
                service.SendMessageRequest(messages=[message]), metadata=metadata, timeout=10
            )
            return reply.status.code

        def receive_as(metadata: list[tuple[str, str]], group: str) -> int:
            request = service.ReceiveMessageRequest()
            request.CopyFrom(receive)
            request.group.name = group
            replies = list(stub.ReceiveMessage(request, metadata=metadata, timeout=10))
            return replies[0].status.code

        assert send([("x-mq-client-id", "c")]) == Code.UNAUTHORIZED  # no authorization header
        assert send(v2_signed("nobody", "x")) == Code.UNAUTHORIZED  # unknown key
        assert send(v2_signed("shop-writer", "not-the-secret")) == Code.UNAUTHORIZED  # wrong signature
        assert send(v2_signed("shop-reader", "reader-secret")) == Code.FORBIDDEN  # SUB only
        assert send(v2_signed("shop-writer", "writer-secret")) == Code.OK
        assert send(v2_signed("ops", "ops-secret")) == Code.OK  # admin
        assert receive_as(v2_signed("shop-writer", "writer-secret"), "auditors") == Code.FORBIDDEN  # PUB only
        assert (
            receive_as(v2_signed("shop-reader", "reader-secret"), "others") == Code.FORBIDDEN
        )  # group denied
        assert receive_as(v2_signed("shop-reader", "reader-secret"), "auditors") == Code.OK
        route = stub.QueryRoute(
            service.QueryRouteRequest(topic=topic), metadata=v2_signed("nobody", "x"), timeout=10
        )
        assert route.status.code == Code.UNAUTHORIZED and not route.message_queues
