"""services.gateway.rocketmq.renewal.HandleRenewer with a dispatch stand-in: renewals happen
ahead of expiry only, acks get the latest handle (waiting for a renewal in flight), and renewal
stops for disconnected clients and after the maximum time."""

from __future__ import annotations

import asyncio

from services.gateway.rocketmq.renewal import HandleRenewer


class Dispatch:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.gate: asyncio.Event | None = None

    async def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        self.calls.append((handle, invisible_ms))
        if self.gate is not None:
            await self.gate.wait()
        return f"{handle}+"


def test_renewal_ahead_of_expiry_and_latest_handle() -> None:
    async def scenario() -> None:
        clock = [0]
        dispatch = Dispatch()
        connected = {"c1": True, "c2": True}
        r = HandleRenewer(
            dispatch,  # type: ignore[arg-type]
            lambda c: connected.get(c, False),
            slice_ms=3000,
            ahead_ms=1000,
            max_ms=10_000,
            clock=lambda: clock[0],
        )
        r.track("c1", "g", "t", "h1", visible_at=3000)
        r.track("c2", "g", "t", "h2", visible_at=3000)
        assert await r.renew_due() == 0 and dispatch.calls == []  # 3 s away: not yet
        clock[0] = 2100
        connected["c2"] = False  # gone: not renewed, forgotten
        assert await r.renew_due() == 1
        assert dispatch.calls == [("h1", 3000)] and len(r) == 1
        assert await r.current("h1") == "h1+" and await r.current("h2") == "h2"
        # An ack while a renewal is in flight gets the handle the renewal produces, and once
        # taken for the ack the delivery is not renewed any more (that would supersede it).
        clock[0] = 4500
        dispatch.gate = asyncio.Event()
        renewal = asyncio.create_task(r.renew_due())
        await asyncio.sleep(0)
        waiting = asyncio.create_task(r.take("h1"))
        await asyncio.sleep(0)
        assert not waiting.done()
        dispatch.gate.set()
        assert await renewal == 1
        handle, token = await waiting
        assert handle == "h1++" and len(r) == 0
        calls = len(dispatch.calls)
        clock[0] = 7400
        assert await r.renew_due() == 0 and len(dispatch.calls) == calls
        # The ack failed (store unreachable): renewal resumes from the latest handle.
        r.restore("h1", token)
        assert await r.current("h1") == "h1++" and await r.renew_due() == 1
        assert dispatch.calls[-1] == ("h1++", 3000)
        await r.take("h1")
        assert len(r) == 0
        # The maximum: a delivery held past max_ms is no longer renewed.
        dispatch.gate = None
        r.track("c1", "g", "t", "h3", visible_at=clock[0] + 500)
        clock[0] += 10_000
        assert await r.renew_due() == 0 and len(r) == 0
        await r.close()

    asyncio.run(scenario())
