"""A cancelled election loop stops, even when the cancellation meets an etcd call that has just
finished (Python 3.11's wait_for then hands back the call's outcome instead of raising)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import aetcd.exceptions
import pytest

from services.commitlog.etcd import EtcdCluster, EtcdUnavailableError


def _cancel_as_the_call_finishes(outcome: Any) -> BaseException | object:
    """Run one EtcdCluster call whose inner call finishes in the same loop turn as the task
    running it is cancelled; return what the task ended with (its result or its exception)."""

    async def scenario() -> BaseException | object:
        loop = asyncio.get_running_loop()
        cluster = EtcdCluster([("127.0.0.1", 9)], timeout_s=5.0)
        inner: asyncio.Future[int] = loop.create_future()

        async def call(_client: Any) -> int:
            return await inner

        task = loop.create_task(cluster._call("get", call))
        for _ in range(3):  # the task is now waiting on the inner call
            await asyncio.sleep(0)

        def finish_and_cancel() -> None:
            if isinstance(outcome, BaseException):
                inner.set_exception(outcome)
            else:
                inner.set_result(outcome)
            task.cancel()

        loop.call_soon(finish_and_cancel)
        try:
            return await task
        except BaseException as exc:
            return exc
        finally:
            await cluster.close()

    return asyncio.run(scenario())


def test_a_cancellation_meeting_a_finished_call_is_not_lost() -> None:
    assert isinstance(_cancel_as_the_call_finishes(7), asyncio.CancelledError)


def test_a_cancellation_meeting_a_failed_call_is_not_turned_into_an_etcd_error() -> None:
    ended = _cancel_as_the_call_finishes(aetcd.exceptions.ConnectionFailedError("endpoint went away"))
    assert isinstance(ended, asyncio.CancelledError), ended
    assert not isinstance(ended, EtcdUnavailableError)


def test_a_call_that_is_not_cancelled_answers() -> None:
    async def scenario() -> int:
        cluster = EtcdCluster([("127.0.0.1", 9)], timeout_s=5.0)

        async def call(_client: Any) -> int:
            return 11

        try:
            return await cluster._call("get", call)
        finally:
            await cluster.close()

    assert asyncio.run(scenario()) == 11


def test_the_scenario_is_the_lost_cancellation(monkeypatch: pytest.MonkeyPatch) -> None:
    """With asyncio.wait_for in place of wait_within and without the check after the call,
    Python 3.11 hands the finished call's result to the cancelled task (3.12's wait_for raises
    instead), so the tests above exercise the real case."""
    import services.commitlog.etcd as etcd

    monkeypatch.setattr(etcd, "_raise_if_cancelling", lambda: None)
    monkeypatch.setattr(etcd, "wait_within", asyncio.wait_for)
    ended = _cancel_as_the_call_finishes(7)
    if sys.version_info >= (3, 12):
        assert isinstance(ended, asyncio.CancelledError)
    else:
        assert ended == 7


def test_stop_returns_even_when_a_loop_outlives_its_cancellation(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A shutdown must not hang on the election: stop() waits STOP_WAIT_S for its loops, then
    says which one did not end and goes on."""
    import services.commitlog.election as election

    monkeypatch.setattr(election, "STOP_WAIT_S", 0.3)

    class Cluster:
        closed = False

        async def close(self) -> None:
            self.closed = True

    async def scenario() -> tuple[float, bool, bool]:
        agent = election.ElectionAgent.__new__(election.ElectionAgent)
        agent.lease = 0
        agent.leading = None
        agent._valid_until = 0.0
        agent._stopping = False
        agent.cluster = Cluster()  # type: ignore[assignment]

        async def stubborn() -> None:  # a loop whose cancellation was swallowed (once)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)
            await asyncio.sleep(10)

        task = asyncio.get_running_loop().create_task(stubborn(), name="election")
        agent._tasks = [task]
        await asyncio.sleep(0)
        started = asyncio.get_running_loop().time()
        await agent.stop()
        took = asyncio.get_running_loop().time() - started
        still_running = not task.done()
        task.cancel()  # the test's own clean-up
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return took, still_running, agent.cluster.closed  # type: ignore[attr-defined]

    took, still_running, closed = asyncio.run(scenario())
    assert 0.25 <= took < 2.0
    assert still_running and closed
    assert "did not stop within" in caplog.text
