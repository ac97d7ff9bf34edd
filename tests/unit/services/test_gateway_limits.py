"""Gateway bounds in isolation: held long polls per connection and in total, the Telemetry
outbox and streams per client, and RocketMQ 5 error statuses."""

from __future__ import annotations

import asyncio
import logging

import pytest

from libstore import InvalidArgumentError, StoreConfig, StoreIOError
from libstore.errors import TooManyRequestsError
from services.gateway.limits import GatewayLimits, HeldPolls
from services.gateway.rocketmq.error_status import error_status
from services.gateway.rocketmq.pb import Code
from services.gateway.rocketmq.sessions import ClientSessions


def test_limits_come_from_the_config() -> None:
    limits = GatewayLimits.from_config(StoreConfig(max_messages_per_request=3, max_held_polls_per_client=5))
    assert (limits.max_messages_per_request, limits.max_held_polls_per_client) == (3, 5)
    assert limits.request_problem(3, 10) == ""
    assert "maxMessagesPerRequest" in limits.request_problem(4, 10)
    assert "maxRequestBytes" in limits.request_problem(1, limits.max_request_bytes + 1)


def test_held_polls_are_bounded_per_client_and_in_total() -> None:
    held = HeldPolls(max_total=3, max_per_client=2)
    with held.hold("a") as a1, held.hold("a") as a2, held.hold("a") as a3:
        assert (a1, a2, a3) == (True, True, False)
        with held.hold("b") as b1, held.hold("c") as c1:
            assert (b1, c1) == (True, False)  # the total is reached
            assert held.held == 3
    assert held.held == 0
    with held.hold("a") as again:
        assert again


def test_telemetry_outbox_pushes_back_and_drops_server_commands_when_full() -> None:
    async def scenario() -> None:
        sessions = ClientSessions(max_streams=1, outbox_max=2)
        session = sessions.open("c1")
        with pytest.raises(TooManyRequestsError):
            sessions.open("c1")
        await session.put("r1")
        assert session.offer("check")
        assert not session.offer("check2")  # full: dropped
        blocked = asyncio.create_task(session.put("r2"))
        await asyncio.sleep(0.01)
        assert not blocked.done() and session.outbox.qsize() == 2
        assert await session.next() == "r1"
        await asyncio.wait_for(blocked, 5)
        sessions.drop("c1")
        assert [await session.next() for _ in range(3)] == ["check", "r2", None]
        assert not sessions.has_client("c1")

    asyncio.run(scenario())


def test_v2_error_status_hides_internals(caplog: pytest.LogCaptureFixture) -> None:
    client = error_status(InvalidArgumentError("max_count must be within 1..32"), "ReceiveMessage")
    assert (client.code, client.message) == (Code.BAD_REQUEST, "max_count must be within 1..32")
    with caplog.at_level(logging.ERROR):
        io = error_status(StoreIOError("cannot write /srv/store/commitlog/0000"), "SendMessage")
        bug = error_status(KeyError("pop-state"), "AckMessage")
    assert bug.code == Code.INTERNAL_SERVER_ERROR
    for status in (io, bug):
        assert "/srv" not in status.message and "pop-state" not in status.message
        correlation = status.message.rsplit(" ", 1)[-1]
        assert any(correlation in r.getMessage() for r in caplog.records)
