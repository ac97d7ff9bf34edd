"""Resource namespaces of the RocketMQ 5 protocol (services.gateway.rocketmq.namespace): the
name mapping, and requests and responses rewritten at any depth."""

from __future__ import annotations

from services.gateway.rocketmq import namespace
from services.gateway.rocketmq.pb import definition, service


def test_names_map_as_rocketmq_maps_them() -> None:
    assert namespace.wrap("nsA", "T1") == "nsA%T1"
    assert namespace.wrap("nsA", "nsA%T1") == "nsA%T1"  # already carries it
    assert namespace.wrap("nsA", "%DLQ%G1") == "%DLQ%nsA%G1"
    assert namespace.wrap("nsA", "%RETRY%G1") == "%RETRY%nsA%G1"
    assert namespace.wrap("", "T1") == "T1"
    for name in ("T1", "%DLQ%G1", "%RETRY%G1"):
        assert namespace.unwrap("nsA", namespace.wrap("nsA", name)) == name
    assert namespace.unwrap("nsA", "nsB%T1") == "nsB%T1"  # another namespace's name stays


def test_requests_and_responses_are_rewritten_at_any_depth() -> None:
    def res(name: str, ns: str = "nsA") -> definition.Resource:
        return definition.Resource(resource_namespace=ns, name=name)

    request = service.SendMessageRequest(
        messages=[definition.Message(topic=res("T1")), definition.Message(topic=res("T2", ""))]
    )
    namespace.wrap_request(request)
    assert [m.topic.name for m in request.messages] == ["nsA%T1", "T2"]
    settings = service.TelemetryCommand(
        settings=definition.Settings(
            subscription=definition.Subscription(
                group=res("G1"), subscriptions=[definition.SubscriptionEntry(topic=res("T1"))]
            )
        )
    )
    namespace.wrap_request(settings)
    assert settings.settings.subscription.group.name == "nsA%G1"
    assert settings.settings.subscription.subscriptions[0].topic.name == "nsA%T1"
    route = service.QueryRouteResponse(
        message_queues=[
            definition.MessageQueue(topic=res("nsA%T1", "")),
            definition.MessageQueue(topic=res("T9", "")),
        ]
    )
    namespace.unwrap_response(route, "nsA")
    assert [(q.topic.name, q.topic.resource_namespace) for q in route.message_queues] == [
        ("T1", "nsA"),
        ("T9", ""),
    ]
