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
        async with r.settling(["h1", "h2"]) as handles:  # the latest handle; unknown as given
            assert handles == ["h1+", "h2"]
        assert len(r) == 0  # settled: no longer renewed
        r.track("c1", "g", "t", "h1", visible_at=2000)  # delivered again (attempt 2)
        # An ack while a renewal is in flight gets the handle the renewal produces, and while it
        # settles the delivery is not renewed (that would supersede the acked handle).
        clock[0] = 4500
        dispatch.gate = asyncio.Event()
        renewal = asyncio.create_task(r.renew_due())
        await asyncio.sleep(0)
        inside = asyncio.Event()
        release = asyncio.Event()

        async def failing_ack() -> None:
            async with r.settling(["h1"]) as (handle,):
                assert handle == "h1+"
                inside.set()
                await release.wait()
                raise ConnectionError("the store is unreachable")

        ack = asyncio.create_task(failing_ack())
        await asyncio.sleep(0)
        assert not inside.is_set()  # waits for the renewal in flight
        dispatch.gate.set()
        assert await renewal == 1
        await asyncio.wait_for(inside.wait(), 5)
        calls = len(dispatch.calls)
        clock[0] = 7400
        assert await r.renew_due() == 0 and len(dispatch.calls) == calls
        # The ack failed: renewal resumes from the latest handle.
        release.set()
        try:
            await asyncio.wait_for(ack, 5)
            raise AssertionError("the ack's error must come through")
        except ConnectionError:
            pass
        assert await r.renew_due() == 1 and dispatch.calls[-1] == ("h1+", 3000)
        async with r.settling(["h1"]) as (handle,):
            assert handle == "h1++"
        assert len(r) == 0
        # The maximum: a delivery held past max_ms is no longer renewed.
        dispatch.gate = None
        r.track("c1", "g", "t", "h3", visible_at=clock[0] + 500)
        clock[0] += 10_000
        assert await r.renew_due() == 0 and len(r) == 0
        await r.close()

    asyncio.run(scenario())
