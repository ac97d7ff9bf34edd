"""The pop model on the dispatch service (services.dispatch.pop), through its port in an
embedded suite: a held receive wakes when a change of invisible time makes a message visible
sooner (retries and the DLQ are covered through the official client, test_rocketmq_client)."""

from __future__ import annotations

import asyncio
import time

from services.client import Producer
from services.serve import Suite
from tests.service.harness import InProcessSuites


def test_a_held_pop_wakes_when_a_message_is_made_visible_sooner(
    suites: InProcessSuites, embedded: Suite
) -> None:
    """A receive held on an empty topic computed its hold from the in-flight message's 60 s
    invisible time; a change of that time to 200 ms must wake it (a push consumer's nack)."""
    with Producer(embedded.address) as producer:
        assert producer.send("Nacked", b"retry me", queue_id=0).all_ok
    assert embedded.dispatch_app is not None
    port = embedded.dispatch_app.port

    async def scenario() -> tuple[int, int, float]:
        (first,) = (await port.pop("g", "Nacked", -1, invisible_ms=60_000, wait_ms=5_000)).messages
        held = asyncio.create_task(port.pop("g", "Nacked", -1, invisible_ms=60_000, wait_ms=20_000))
        await asyncio.sleep(0.3)  # the second pop is held now, until 60 s from the first
        changed = time.monotonic()
        await port.change_invisible("g", "Nacked", first.receipt_handle, 200)
        (again,) = (await held).messages
        return first.attempt, again.attempt, time.monotonic() - changed

    first, again, waited_s = suites.loop.run(scenario(), 60)
    assert (first, again) == (1, 2)
    # Woken, not found by the hold's final look: un-woken, it would return after its 20 s.
    assert waited_s < 10, waited_s
