"""The official Apache RocketMQ 5 Python client (rocketmq-python-client 5.1.2) against the
gateway's apache.rocketmq.v2 MessagingService (issue "Gateway speaks Apache RocketMQ 5's gRPC
protocol").

The suite runs as ``mqstore serve`` processes (bench.service_bench.running_suite); load comes from
client processes running tests/rocketmq/client_driver.py (the client's protobuf stubs cannot share
a process with ours):

* produce: ``processes`` Producers, each sending ``count`` 1 KiB messages with send_async and 64
  in flight (the client sends one message per SendMessage call);
* consume: ``processes`` SimpleConsumers of one group, receive(32) then one ack per message, until
  the group has everything (each stops when nothing more comes); timed per consumer from its first
  message to its last.

Rates are the sum of the processes' rates (each measured over its own run).

:func:`ceiling` measures what the client itself allows, one call at a time: one Producer sending
one message per call and waiting for it, and one SimpleConsumer doing receive(32) then one ack
per message, against the embedded gateway and against a do-nothing MessagingService
(bench.floor_messaging) in the same run, alternating, medians of ``rounds``.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.peer_servers import floor_messaging
from bench.service_bench import TOPIC, running_suite
from tests.rocketmq.harness import finish_driver, start_driver


@dataclass
class ClientRun:
    messages: int
    msgs_per_s: float
    errors: int


def _run(scenario: str, args_of: list[dict], home: Path, timeout_s: float = 900.0) -> list[dict]:
    procs = [start_driver(scenario, a, home / f"{scenario}{i}") for i, a in enumerate(args_of)]
    return [finish_driver(p, timeout_s) for p in procs]


def run(root: Path, topology: str, processes: int = 2, count: int = 10_000) -> tuple[ClientRun, ClientRun]:
    """Produce then consume ``processes`` x ``count`` messages; (produce, consume) results."""
    with running_suite(root, topology, "ASYNC_FLUSH") as address, tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        sent = _run(
            "send_many",
            [{"endpoint": address, "topic": TOPIC, "count": count, "size": 1024, "window": 64}] * processes,
            home,
        )
        produce = ClientRun(
            sum(len(r["ids"]) for r in sent),
            sum(len(r["ids"]) / r["seconds"] for r in sent),
            sum(len(r["errors"]) for r in sent),
        )
        got = _run(
            "receive_many",
            [{"endpoint": address, "topic": TOPIC, "group": "bench-v2", "count": produce.messages}]
            * processes,
            home,
        )
        consume = ClientRun(
            sum(r["acked"] for r in got),
            sum(r["acked"] / r["seconds"] for r in got if r["seconds"]),
            sum(r["errors"] for r in got),
        )
    return produce, consume


@dataclass
class Ceiling:
    """One workload's medians (msgs/s) against the gateway and against the do-nothing server,
    and the gateway/server ratio of each round (the two ran back to back in it, so a slow spell
    of the shared host weighs on both)."""

    name: str
    gateway: float
    floor: float
    round_ratios: list[float]

    @property
    def ratio(self) -> float:
        """The median of the rounds' ratios (0.0 when no round measured both)."""
        return statistics.median(self.round_ratios) if self.round_ratios else 0.0


def _one_at_a_time(address: str, home: Path, sends: int, receives: int) -> tuple[float, float]:
    """(sends/s one at a time, msgs/s of receive(32) + ack each) of one client process each."""
    (sent,) = _run(
        "send_many", [{"endpoint": address, "topic": TOPIC, "count": sends, "size": 1024, "window": 1}], home
    )
    (got,) = _run(
        "receive_many",
        [{"endpoint": address, "topic": TOPIC, "group": "bench-ceiling", "count": receives, "idle_s": 3}],
        home,
    )
    return len(sent["ids"]) / sent["seconds"], got["acked"] / got["seconds"] if got["seconds"] else 0.0


def ceiling(root: Path, rounds: int = 5, sends: int = 2000, receives: int = 4000) -> list[Ceiling]:
    """The official client one call at a time against the embedded gateway (ASYNC_FLUSH) and the
    do-nothing MessagingService, ``rounds`` alternating rounds (which of the two goes first
    alternates too); medians, and each round's ratio."""
    gateway: list[tuple[float, float]] = []
    floor: list[tuple[float, float]] = []
    with (
        running_suite(root, "embedded", "ASYNC_FLUSH") as address,
        floor_messaging(root) as bare,
        tempfile.TemporaryDirectory() as tmp,
    ):
        home = Path(tmp)
        # What the consumers of every round take: a backlog sent 64 in flight (not measured).
        backlog = [
            {"endpoint": address, "topic": TOPIC, "count": receives * rounds, "size": 1024, "window": 64}
        ]
        _run("send_many", backlog, home)
        for k in range(rounds):
            if k % 2:
                floor.append(_one_at_a_time(f"{bare.host}:{bare.port}", home, sends, receives))
                gateway.append(_one_at_a_time(address, home, sends, receives))
            else:
                gateway.append(_one_at_a_time(address, home, sends, receives))
                floor.append(_one_at_a_time(f"{bare.host}:{bare.port}", home, sends, receives))
    return [
        Ceiling(
            name,
            statistics.median(r[i] for r in gateway),
            statistics.median(r[i] for r in floor),
            [g[i] / f[i] for g, f in zip(gateway, floor, strict=True) if f[i]],
        )
        for i, name in enumerate(("send one at a time", "receive(32) + ack each"))
    ]
