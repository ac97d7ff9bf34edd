"""``python -m bench --suite peers``: mqstore next to other brokers on the same workload
(bench.peer_workload), each broker a real server process on 127.0.0.1 started for its row.

Rows, in order:

* the bare-gRPC floor: bench.floor_server (Produce answers PUT_OK at once) and our own client,
  one message per Produce call: what any Produce costs before the store does anything;
* mqstore: ``mqstore serve`` embedded (bench.service_bench.running_processes), ASYNC_FLUSH and
  SYNC_FLUSH, our own client;
* Redis 7 Streams, appendfsync everysec and always; NATS JetStream (file store); RabbitMQ 3, a
  stream and a durable classic queue with publisher confirms (bench.peer_servers, bench.peer_clients).

The floor and the two mqstore rows, whose ratios are the request-path targets, run side by side
(:func:`run_alternating`): their three servers stay up for the whole run and the rounds take
turns (floor round 0, ASYNC_FLUSH round 0, SYNC_FLUSH round 0, floor round 1, ...), so a machine
that slows down or speeds up during the run (a shared host drifts by tens of percent within
minutes) weighs on each of them alike. The other brokers follow, one row at a time.

Each row names the mqstore row it is compared with: ASYNC_FLUSH for peers that acknowledge
before an fsync, SYNC_FLUSH for those that acknowledge after one. A broker or client package
that is missing, or a broker that does not start, makes its row "skipped" with the reason; a
row whose run breaks off (a refused message, a failed check) is "failed" with the reason. No
row ever shows numbers it did not measure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from bench import peer_servers
from bench.harness import payload_pool, scratch_dir
from bench.peer_clients import (
    JetStreamClient,
    MqstoreClient,
    RabbitClassicClient,
    RabbitStreamClient,
    RedisStreamClient,
    import_client,
)
from bench.peer_servers import HOST, PeerServer, PeerUnavailable
from bench.peer_workload import PeerClient, Workload, WorkloadResult, run_round
from bench.service_bench import running_processes

ASYNC, SYNC = "ASYNC_FLUSH", "SYNC_FLUSH"
TARGETS = {  # the targets for one message per Produce call, checked in the notes table
    "async_vs_floor": 0.8,  # ASYNC_FLUSH single rate >= this x the floor's
    "sync_vs_floor": 0.6,  # SYNC_FLUSH single rate >= this x the floor's
    "async_p99_ms": 2.0,  # ASYNC_FLUSH single p99 <= this (ms)
    "cpu_us_per_call": 250.0,  # server CPU per single-message Produce <= this (µs)
}


@dataclass(frozen=True)
class PeerSpec:
    """One row of the table: how to start the server and make a client for a round."""

    key: str  # short id (``--only`` matches it), e.g. "redis-always"
    system: str
    config: str
    acked_when: str  # what an acknowledgement means for durability
    compare_with: str | None  # the mqstore row (ASYNC_FLUSH / SYNC_FLUSH) for the ratio columns
    server: Callable[[Path], AbstractContextManager[PeerServer]]
    client: Callable[[PeerServer], PeerClient]
    requires: tuple[tuple[str, str], ...] = ()  # (module, pip package) the client imports
    consume: bool = True


@dataclass
class PeerRow:
    """A row's outcome: a result, or the reason there is none (skipped: could not run; failed:
    the run broke off)."""

    spec: PeerSpec
    result: WorkloadResult | None = None
    skipped: str | None = None
    failed: str | None = None


@contextmanager
def _mqstore(root: Path, flush: str) -> Iterator[PeerServer]:
    with running_processes(root, "embedded", flush) as suite:
        port = int(suite.address.rsplit(":", 1)[1])
        yield PeerServer(suite.pids[0], port, {}, root / "embedded.log")


def _address(server: PeerServer) -> str:
    return f"{HOST}:{server.port}"


def default_specs() -> list[PeerSpec]:
    """The rows of the suite, in the order they run."""
    return [
        PeerSpec(
            "floor",
            "bare gRPC floor",
            "grpc.aio Produce → PUT_OK, nothing stored",
            "at once (nothing stored)",
            ASYNC,
            peer_servers.floor_server,
            lambda s: MqstoreClient(_address(s), floor=True),
            consume=False,
        ),
        PeerSpec(
            "mqstore-async",
            "mqstore (embedded)",
            ASYNC,
            "appended to the mapped CommitLog; flushed every 500 ms",
            None,
            lambda root: _mqstore(root, ASYNC),
            lambda s: MqstoreClient(_address(s)),
        ),
        PeerSpec(
            "mqstore-sync",
            "mqstore (embedded)",
            SYNC,
            "after the group commit's fsync",
            None,
            lambda root: _mqstore(root, SYNC),
            lambda s: MqstoreClient(_address(s)),
        ),
        PeerSpec(
            "redis-everysec",
            "Redis 7 Streams",
            "AOF, appendfsync everysec",
            "written to the AOF; fsync once a second",
            ASYNC,
            lambda root: peer_servers.redis_server(root, "everysec"),
            RedisStreamClient,
            (("redis", "redis"),),
        ),
        PeerSpec(
            "redis-always",
            "Redis 7 Streams",
            "AOF, appendfsync always",
            "after the AOF's fsync",
            SYNC,
            lambda root: peer_servers.redis_server(root, "always"),
            RedisStreamClient,
            (("redis", "redis"),),
        ),
        PeerSpec(
            "nats",
            "NATS JetStream",
            "file store",
            "written to the file store; fsync every 2 min (sync_interval)",
            ASYNC,
            peer_servers.nats_server,
            JetStreamClient,
            (("nats", "nats-py"),),
        ),
        PeerSpec(
            "rabbitmq-stream",
            "RabbitMQ 3",
            "stream (stream protocol), confirms",
            "written to the stream's segment; no fsync",
            ASYNC,
            peer_servers.rabbitmq_server,
            RabbitStreamClient,
            (("rstream", "rstream"),),
        ),
        PeerSpec(
            "rabbitmq-classic",
            "RabbitMQ 3",
            "classic durable queue, persistent, confirms",
            "persisted (fsync) before the confirm",
            SYNC,
            peer_servers.rabbitmq_server,
            RabbitClassicClient,
            (("pika", "pika"),),
        ),
    ]


def run_peer(spec: PeerSpec, data_dir: Path, workload: Workload) -> PeerRow:
    """Start ``spec``'s server in a scratch folder under ``data_dir``, run the workload, stop it
    (:func:`run_alternating` with nobody to take turns with)."""
    return run_alternating([spec], data_dir, workload)[0]


ALTERNATED = ("floor", "mqstore-async", "mqstore-sync")  # rows run side by side (module docstring)


def run_alternating(specs: list[PeerSpec], data_dir: Path, workload: Workload) -> list[PeerRow]:
    """Start every spec's server, then run ``workload.rounds`` rounds taking turns between them
    (spec 0 round 0, spec 1 round 0, ..., spec 0 round 1, ...); stop them all. A spec whose
    server or client is unavailable is skipped, one whose round breaks off is failed from then
    on; the others go on. Returns one row per spec, in their order."""
    rows: dict[str, PeerRow] = {}
    servers: dict[str, PeerServer] = {}
    with ExitStack() as stack:
        for spec in specs:
            try:
                for module, package in spec.requires:
                    import_client(module, package)
                root = stack.enter_context(scratch_dir(data_dir, f"peers-{spec.key}"))
                servers[spec.key] = stack.enter_context(spec.server(root))
                rows[spec.key] = PeerRow(spec, WorkloadResult())
            except PeerUnavailable as exc:
                rows[spec.key] = PeerRow(spec, skipped=str(exc))
            except Exception as exc:  # a server that breaks is reported in its row
                rows[spec.key] = PeerRow(spec, failed=f"{type(exc).__name__}: {exc}")
        pools = {spec.key: payload_pool(1 << 20, seed=f"peers-{spec.key}".encode()) for spec in specs}
        for n in range(workload.rounds):
            for spec in specs:
                row, server = rows[spec.key], servers.get(spec.key)
                if row.result is None or server is None:
                    continue
                try:
                    round_ = asyncio.run(
                        run_round(
                            spec.client(server),
                            f"peers-{spec.key}-{n}",
                            workload,
                            pool=pools[spec.key],
                            server_pid=server.pid,
                            consume=spec.consume,
                        )
                    )
                except Exception as exc:  # a broken round is reported in its row, and the others go on
                    rows[spec.key] = PeerRow(spec, failed=f"{type(exc).__name__}: {exc}")
                    continue
                row.result.rounds.append(round_)
    return [rows[spec.key] for spec in specs]


def run(console: Console, data_dir: Path, facts: dict[str, str], only: str = "") -> list[str]:
    """Run every row (those whose key contains ``only``), print them, save JSON and return the
    markdown for bench/README.md."""
    workload = Workload()
    rows = []
    t0 = time.monotonic()
    load_before = os.getloadavg()[0]
    specs = [spec for spec in default_specs() if not only or only in spec.key]
    together = [spec for spec in specs if spec.key in ALTERNATED]
    if together:
        console.print(f"  {', '.join(spec.key for spec in together)}, rounds taking turns ...")
        started = time.monotonic()
        rows.extend(run_alternating(together, data_dir, workload))
        for row in rows:
            console.print(f"  {row.spec.system}, {row.spec.config} ... {_summary(row)}", markup=False)
        console.print(f"  ({time.monotonic() - started:.0f} s)")
    for spec in specs:
        if spec.key in ALTERNATED:
            continue
        console.print(f"  {spec.system}, {spec.config} ...", end="")
        started = time.monotonic()
        row = run_peer(spec, data_dir, workload)
        rows.append(row)
        console.print(f" {_summary(row)} ({time.monotonic() - started:.0f} s)", markup=False)
    console.print(f"  peers suite: {time.monotonic() - t0:.0f} s")
    lines = markdown(rows, facts, workload, (load_before, os.getloadavg()[0]))
    for line in lines:
        console.print(line, markup=False)
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out_dir / f"peers-{stamp}.json").write_text(json.dumps(to_json(rows, facts, workload), indent=1))
    (out_dir / "peers-latest.md").write_text("\n".join(lines) + "\n")
    return lines


def _summary(row: PeerRow) -> str:
    if row.result is None:
        return f"skipped: {row.skipped}" if row.skipped else f"FAILED: {row.failed}"
    r = row.result
    consume = f", consume {r.consume_msgs_per_s:,.0f}/s" if r.consume_msgs_per_s is not None else ""
    return (
        f"batch {r.batch_msgs_per_s:,.0f}/s, single {r.single_msgs_per_s:,.0f}/s "
        f"(p50 {r.single_latency_ms(50):.2f} ms, p99 {r.single_latency_ms(99):.2f} ms){consume}"
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or theirs <= 0:
        return "-"
    return f"{ours / theirs:.2f}x"


def _ratios(ours: WorkloadResult | None, theirs: WorkloadResult) -> list[str]:
    """mqstore/peer for batch, single and consume rates ("-" where either is missing)."""
    if ours is None:
        return ["-"] * 3
    return [
        _ratio(ours.batch_msgs_per_s, theirs.batch_msgs_per_s),
        _ratio(ours.single_msgs_per_s, theirs.single_msgs_per_s),
        _ratio(ours.consume_msgs_per_s, theirs.consume_msgs_per_s),
    ]


def markdown(
    rows: list[PeerRow], facts: dict[str, str], workload: Workload, load: tuple[float, float] | None = None
) -> list[str]:
    """The README block: the table, the floor targets, and the skipped or failed rows. ``load``:
    the machine's 1-minute load average before and after the run (other work shares the cores)."""
    mqstore = {r.spec.config: r.result for r in rows if r.spec.key.startswith("mqstore") and r.result}
    lines = [
        f"Measured {facts['date']} on {facts['cpu']} ({facts['cores']} cores), Python {facts['python']}, "
        f"data on `{facts['filesystem']}`; every server and the client share the cores"
        + (f" (1-minute load average {load[0]:.1f} before the run, {load[1]:.1f} after)" if load else "")
        + ". "
        f"{workload.rounds} rounds per row, each on a fresh queue: {workload.batch_messages:,} messages "
        f"in batches of {workload.batch_size:,} (one batch in flight), {workload.single_messages:,} one "
        f"at a time, then all {workload.messages_per_round:,} consumed and checked. Rates are medians "
        "of the rounds; latencies are over all single calls.",
        "",
        "| broker | config | an ack means | batch msgs/s | single msgs/s | single p50 ms | single p99 ms "
        "| server CPU µs/call | consume msgs/s | vs mqstore | mqstore/peer batch | mqstore/peer single "
        "| mqstore/peer consume |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for row in rows:
        spec, r = row.spec, row.result
        head = f"| {spec.system} | {spec.config} | {spec.acked_when} |"
        if r is None:
            state = "skipped" if row.skipped else "failed"
            lines.append(head + f" {state} | - | - | - | - | - | {spec.compare_with or '-'} | - | - | - |")
            notes.append(f"- {spec.system}, {spec.config}: {state}: {row.skipped or row.failed}")
            continue
        ours = mqstore.get(spec.compare_with) if spec.compare_with else None
        cpu = r.server_cpu_us_per_call
        lines.append(
            head + f" {_rate(r.batch_msgs_per_s)} | {_rate(r.single_msgs_per_s)} | "
            f"{r.single_latency_ms(50):.2f} | {r.single_latency_ms(99):.2f} | "
            f"{'-' if cpu is None else f'{cpu:,.0f}'} | {_rate(r.consume_msgs_per_s)} | "
            f"{spec.compare_with or '-'} | " + " | ".join(_ratios(ours, r)) + " |"
        )
    lines += ["", *_targets(rows)]
    if notes:
        lines += ["", "Rows without numbers:", "", *notes]
    return lines


def _targets(rows: list[PeerRow]) -> list[str]:
    """The issue's single-message targets against the floor measured in the same run."""
    by_key = {r.spec.key: r.result for r in rows if r.result is not None}
    floor, a, s = by_key.get("floor"), by_key.get("mqstore-async"), by_key.get("mqstore-sync")

    def per_floor(x: WorkloadResult | None) -> float | None:
        return x.single_msgs_per_s / floor.single_msgs_per_s if x and floor else None

    def cpu(x: WorkloadResult | None) -> float | None:
        return x.server_cpu_us_per_call if x else None

    checks: list[tuple[str, float | None, str, float | None, str]] = [
        ("ASYNC_FLUSH single rate / floor", per_floor(a), ">=", TARGETS["async_vs_floor"], ".2f"),
        ("SYNC_FLUSH single rate / floor", per_floor(s), ">=", TARGETS["sync_vs_floor"], ".2f"),
        (
            "ASYNC_FLUSH single p99 (ms)",
            a.single_latency_ms(99) if a else None,
            "<=",
            TARGETS["async_p99_ms"],
            ".2f",
        ),
        ("server CPU per single Produce, ASYNC_FLUSH (µs)", cpu(a), "<=", TARGETS["cpu_us_per_call"], ",.0f"),
        ("server CPU per single Produce, SYNC_FLUSH (µs)", cpu(s), "<=", TARGETS["cpu_us_per_call"], ",.0f"),
        ("server CPU per single Produce, floor (µs)", cpu(floor), "", None, ",.0f"),
    ]
    out = ["| one message per Produce call (same run) | measured | target | met |", "|---|---|---|---|"]
    for name, value, op, bound, fmt in checks:
        shown = "-" if value is None else format(value, fmt)
        target, met = "(reference)", "-"
        if bound is not None:
            target = f"{op} {bound:g}"
            if value is not None:
                met = "yes" if (value >= bound if op == ">=" else value <= bound) else "no"
        out.append(f"| {name} | {shown} | {target} | {met} |")
    return out


def to_json(rows: list[PeerRow], facts: dict[str, str], workload: Workload) -> dict[str, object]:
    """Raw numbers of a run (bench/results/peers-*.json)."""
    out: list[dict[str, object]] = []
    for row in rows:
        item: dict[str, object] = {"key": row.spec.key, "skipped": row.skipped, "failed": row.failed}
        if row.result is not None:
            item["rounds"] = [
                {
                    "batch_msgs_per_s": rr.batch_msgs_per_s,
                    "single_msgs_per_s": rr.single.msgs_per_s,
                    "single_p50_ms": rr.single.percentile_ms(50),
                    "single_p99_ms": rr.single.percentile_ms(99),
                    "consume_msgs_per_s": rr.consume_msgs_per_s,
                    "single_server_cpu_s": rr.single_server_cpu_s,
                }
                for rr in row.result.rounds
            ]
        out.append(item)
    return {"machine": facts, "workload": dataclasses.asdict(workload), "rows": out}
