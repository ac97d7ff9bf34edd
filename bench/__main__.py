"""``python -m bench`` (``make bench``): run the benchmarks, print tables, save JSON, and with
``--write-readme`` replace the results block of bench/README.md.

Not part of ``make test``: speed targets live here, never in timed unit tests.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import baseline, commit_log_bench, ha_bench, service_bench, store_bench
from bench.harness import machine_facts, scratch_dir
from libstore import FlushDiskType
from services.dispatch.transient_release import RELEASE_INTERVAL_S

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
SERVICE_RUNS = 3  # the services suite's rows are medians of this many runs in one suite's life
TRANSIENT_RUNS = 5  # the interleaved transient / ASYNC_FLUSH rows differ by a few percent: more rounds than 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window per scenario (s)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path("data/bench"),
        help="where stores are created (the disk under test); default ./data/bench",
    )
    parser.add_argument(
        "--suite",
        choices=(
            "all",
            "commit_log",
            "store",
            "services",
            "ha",
            "rocketmq",
            "spark",
            "peers",
            "recovery",
            "retention",
            "failover",
        ),
        default="all",
        help="commit_log: append matrix; store: dispatch, key query, pull; services: over the gateway; "
        "ha: replication; rocketmq: the official RocketMQ 5 client over the gateway; "
        "spark: data source and jobs; peers: mqstore next to Redis, NATS JetStream and RabbitMQ; "
        "recovery: clean and SIGKILL restarts as the log grows; "
        "retention: produce latency while a cleanup round deletes 100 segments; "
        "failover: a master SIGKILLed under load, until the elected one acknowledges (etcd)",
    )
    parser.add_argument("--failover-rounds", type=int, default=20, help="failover suite: masters killed")
    parser.add_argument(
        "--recovery-gib",
        default="1,4,8",
        help="recovery suite: log sizes (GiB, comma-separated) the store grows through",
    )
    parser.add_argument("--only", default="", help="run only scenarios whose name contains this text")
    parser.add_argument("--write-readme", action="store_true", help="update bench/README.md's table")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be > 0")
    console = Console()
    data_dir: Path = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    facts = machine_facts(data_dir)
    console.print(f"[bold]mqstore bench[/] on {facts['cpu']} x{facts['cores']}, {facts['filesystem']}")

    failed = 0
    if args.suite in ("all", "store"):
        lines = _store_suite(console, data_dir, facts)
        if args.write_readme:
            _write_readme("store", lines)
    if args.suite in ("all", "services"):
        lines = _services_suite(console, data_dir, facts)
        if args.write_readme:
            _write_readme("services", lines)
    if args.suite in ("all", "ha"):
        lines = _ha_suite(console, data_dir, facts)
        if args.write_readme:
            _write_readme("ha", lines)
    if args.suite in ("all", "rocketmq"):
        lines = _rocketmq_suite(console, data_dir, facts)
        if args.write_readme:
            _write_readme("rocketmq", lines)
    if args.suite in ("all", "spark"):
        lines = _spark_suite(console, data_dir, facts)
        if args.write_readme:
            _write_readme("spark", lines)
    if args.suite in ("all", "peers"):
        lines = _peers_suite(console, data_dir, facts, args.only)
        if args.write_readme:
            _write_readme("peers", lines)
    if args.suite in ("all", "recovery"):
        sizes = tuple(float(x) for x in args.recovery_gib.split(",") if x.strip())
        lines = _recovery_suite(console, data_dir, facts, sizes)
        if args.write_readme:
            _write_readme("recovery", lines)
    if args.suite in ("all", "retention"):
        lines = _retention_suite(console, data_dir, facts)
        if args.write_readme:
            _write_readme("retention", lines)
    if args.suite in ("all", "failover"):
        lines = _failover_suite(console, data_dir, facts, args.failover_rounds)
        if args.write_readme:
            _write_readme("failover", lines)
    if args.suite in ("all", "commit_log"):
        failed += _commit_log_suite(console, args, data_dir, facts)
    if args.write_readme:
        console.print(f"updated {README}")
    return 1 if failed else 0


def _commit_log_suite(
    console: Console, args: argparse.Namespace, data_dir: Path, facts: dict[str, str]
) -> int:
    with scratch_dir(data_dir, "baseline") as d:
        raw = baseline.encode_copy(d, args.seconds)
        sync = baseline.fdatasync_loop(d, args.seconds)
        seq_tool, seq_mb = baseline.sequential_write(d)
    record_bytes = baseline.record_size()
    base_rows = [
        (
            "raw encode + copy into mmap (b=256)",
            f"{raw.msgs_per_s:,.0f} records/s",
            f"{raw.mb_per_s(record_bytes):,.0f} MB/s",
        ),
        (
            "raw pwrite + fdatasync per record",
            f"{sync.msgs_per_s:,.0f} records/s",
            f"p50 {sync.percentile_ms(50):.2f} ms",
        ),
        (f"sequential write ({seq_tool}, 1 MiB blocks + flush)", "", f"{seq_mb:,.0f} MB/s"),
    ]
    results = []
    for sc in commit_log_bench.default_matrix():
        if args.only and args.only not in sc.name:
            continue
        console.print(f"  {sc.name} ...", end="")
        with scratch_dir(data_dir, "store") as d:
            res = commit_log_bench.run(sc, str(d), args.seconds)
        results.append(res)
        console.print(f" {res.sample.msgs_per_s:,.0f} msgs/s")

    lines = _markdown(facts, base_rows, results, raw.msgs_per_s, sync.msgs_per_s, record_bytes, args.seconds)
    table = Table(title="CommitLog append, 1 KiB messages")
    for col in (
        "flush",
        "producers",
        "batch",
        "msgs/s",
        "MB/s",
        "p50 ms",
        "p99 ms",
        "vs baseline",
        "fsyncs/s",
    ):
        table.add_column(col, justify="right")
    for res in results:
        table.add_row(*_cells(res, raw.msgs_per_s, sync.msgs_per_s, record_bytes))
    console.print(table)
    for name, a, b in base_rows:
        console.print(f"baseline: {name}: {a} {b}")

    out_dir = HERE / "results"
    out_dir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    payload = {
        "machine": facts,
        "seconds": args.seconds,
        "record_bytes": record_bytes,
        "baseline": {
            "encode_copy_records_per_s": raw.msgs_per_s,
            "fdatasync_per_s": sync.msgs_per_s,
            "sequential_write": {"tool": seq_tool, "mb_per_s": seq_mb},
        },
        "commit_log": [
            {
                "scenario": r.scenario.name,
                "msgs_per_s": r.sample.msgs_per_s,
                "mb_per_s": r.sample.mb_per_s(record_bytes),
                "p50_ms": r.sample.percentile_ms(50),
                "p99_ms": r.sample.percentile_ms(99),
                "failed_puts": r.failed_puts,
                "group_commit_flushes_per_s": r.group_commit_flushes_per_s,
            }
            for r in results
        ],
    }
    (out_dir / f"commit_log-{stamp}.json").write_text(json.dumps(payload, indent=1))
    (out_dir / "commit_log-latest.md").write_text("\n".join(lines) + "\n")
    if args.write_readme:
        _write_readme("commit_log", lines)
    failed = sum(r.failed_puts for r in results)
    if failed:
        console.print(f"[red]{failed} puts did not return PUT_OK[/]")
    return failed


def _store_suite(console: Console, data_dir: Path, facts: dict[str, str]) -> list[str]:
    lines = [
        f"Measured {facts['date']} on {facts['cpu']} ({facts['cores']} cores), Python {facts['python']}, "
        f"data on `{facts['filesystem']}`.",
        "",
        "| dispatch (1 KiB messages) | records | append msgs/s | dispatch records/s | dispatch / append |",
        "|---|---|---|---|---|",
    ]
    for shape in ("tags", "keyed"):
        console.print(f"  dispatch {shape} ...", end="")
        with scratch_dir(data_dir, "dispatch") as d:
            r = store_bench.dispatch(d, shape, 300_000)
        console.print(
            f" {r.dispatch_records_per_s:,.0f} records/s (append {r.append_msgs_per_s:,.0f} msgs/s)"
        )
        label = "TAGS only" if shape == "tags" else "TAGS + KEYS + UNIQ_KEY (2 index entries)"
        lines.append(
            f"| {label} | {r.records:,} | {r.append_msgs_per_s:,.0f} | {r.dispatch_records_per_s:,.0f} | "
            f"{r.dispatch_records_per_s / r.append_msgs_per_s:.2f} |"
        )
    lines += ["", "| latency | calls | p50 ms | p99 ms | setup |", "|---|---|---|---|---|"]
    for name, run in (("key query", store_bench.key_query), ("pull", store_bench.pull)):
        console.print(f"  {name} ...", end="")
        with scratch_dir(data_dir, name.replace(" ", "-")) as d:
            results = run(d)
        for res in results:
            smp = res.sample
            console.print(f" {res.name}: p99 {smp.percentile_ms(99):.3f} ms", end="")
            lines.append(
                f"| {res.name} | {len(smp.latencies_ns):,} | {smp.percentile_ms(50):.3f} | "
                f"{smp.percentile_ms(99):.3f} | {res.note} |"
            )
        console.print()
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "store-latest.md").write_text("\n".join(lines) + "\n")
    for line in lines:
        console.print(line, markup=False)
    return lines


def _vs(res: commit_log_bench.Result, raw_rate: float, sync_rate: float) -> str:
    if res.scenario.flush is FlushDiskType.ASYNC_FLUSH:
        return f"{res.sample.msgs_per_s / raw_rate:.2f} x encode+copy"
    return f"{res.sample.msgs_per_s / sync_rate:.1f} x fdatasync"


def _cells(res: commit_log_bench.Result, raw_rate: float, sync_rate: float, record_bytes: int) -> list[str]:
    sc = res.scenario
    flush = sc.flush.value + (" +pool" if sc.transient_pool else "")
    producers = f"{sc.producers}" + (" (asyncio)" if sc.mode == "asyncio" else "")
    fsyncs = f"{res.group_commit_flushes_per_s:,.0f}" if sc.flush is FlushDiskType.SYNC_FLUSH else "-"
    p99 = res.sample.percentile_ms(99)
    return [
        flush,
        producers,
        str(sc.batch),
        f"{res.sample.msgs_per_s:,.0f}",
        f"{res.sample.mb_per_s(record_bytes):,.1f}",
        f"{res.sample.percentile_ms(50):.3f}",
        "-" if math.isnan(p99) else f"{p99:.3f}",
        _vs(res, raw_rate, sync_rate),
        fsyncs,
    ]


def _markdown(
    facts: dict[str, str],
    base_rows: list[tuple[str, str, str]],
    results: list[commit_log_bench.Result],
    raw_rate: float,
    sync_rate: float,
    record_bytes: int,
    seconds: float,
) -> list[str]:
    lines = [
        f"Measured {facts['date']} on {facts['cpu']} ({facts['cores']} cores), kernel {facts['kernel']}, "
        f"Python {facts['python']}, data on `{facts['filesystem']}`; {seconds:g} s window per row after "
        f"0.5 s warm-up; record = {record_bytes} bytes.",
        "",
        "| flush | producers | batch | msgs/s | MB/s | p50 ms | p99 ms | vs baseline | fsyncs/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        lines.append("| " + " | ".join(_cells(res, raw_rate, sync_rate, record_bytes)) + " |")
    lines += ["", "| baseline (same run) | rate | |", "|---|---|---|"]
    for name, a, b in base_rows:
        lines.append(f"| {name} | {a} | {b} |")
    return lines


def _services_suite(console: Console, data_dir: Path, facts: dict[str, str]) -> list[str]:
    """Produce and consume over the gateway, embedded and split, ASYNC_FLUSH and SYNC_FLUSH."""
    lines = [
        f"Measured {facts['date']} on {facts['cpu']} ({facts['cores']} cores), Python {facts['python']}; "
        f"server and load-generating clients share the cores; each row: medians of {SERVICE_RUNS} runs "
        f"({TRANSIENT_RUNS} for the interleaved rows, after one round not counted); server µs/msg: "
        "CPU of the server processes (every thread, user + system) per message; server written "
        "B/msg: bytes they dirtied for storage per message (/proc/<pid>/io write_bytes).",
        "",
        "| topology | flush | run | msgs/s | body MB/s | p50 ms | p99 ms | server µs/msg "
        "| server written B/msg |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    per_process = 60_000
    mb = service_bench.BODY / 1e6  # MB of message body per message

    def row(topology: str, flush: str, run: str, m: service_bench.Medians) -> None:
        console.print(
            f"  {topology} {flush} {run}: {m.msgs_per_s:,.0f} msgs/s, p99 {m.p99:.1f} ms, "
            f"server {m.server_us_per_msg:.1f} µs/msg"
        )
        lines.append(
            f"| {topology} | {flush} | {run} | {m.msgs_per_s:,.0f} | {m.msgs_per_s * mb:,.1f} | "
            f"{m.p50:.1f} | {m.p99:.1f} | {m.server_us_per_msg:.1f} | {m.server_write_bytes_per_msg:,.0f} |"
        )

    paired: list[str] = []
    for topology in ("embedded", "split"):
        for flush in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            with (
                scratch_dir(data_dir, f"svc-{topology}") as d,
                service_bench.running_processes(d, topology, flush) as suite,
            ):
                gw, pids = suite.address, suite.pids
                runs = [
                    service_bench.produce(
                        gw, processes=2, per_process=per_process, batch=256, inflight=4, server_pids=pids
                    )
                    for _ in range(SERVICE_RUNS)
                ]
                row(
                    topology,
                    flush,
                    "produce, 2 clients x 4 batches of 256 in flight",
                    service_bench.Medians.of(runs),
                )
                if flush == "ASYNC_FLUSH":
                    # each run a fresh group, reading the first run's messages from the start
                    consumed = [
                        service_bench.consume(gw, f"bench-{i}", runs[0].messages, server_pids=pids)
                        for i in range(SERVICE_RUNS)
                    ]
                    row(
                        topology,
                        flush,
                        "consume, one group, pulls of up to 512",
                        service_bench.Medians.of(consumed),
                    )
                    if topology == "embedded":
                        for offered in (50_000, 20_000):  # open loop, OMB shape
                            paced = service_bench.Medians.of(
                                [
                                    service_bench.produce(
                                        gw,
                                        processes=2,
                                        per_process=per_process,
                                        batch=64,
                                        inflight=32,
                                        rate=offered / 2,
                                        server_pids=pids,
                                    )
                                    for _ in range(SERVICE_RUNS)
                                ]
                            )
                            pushed = f"; {paced.pushed_back:,} calls pushed back" if paced.pushed_back else ""
                            run = f"produce offered at {offered:,} msgs/s (batches of 64, <= 32 in flight"
                            run += f"{pushed})"
                            row(topology, flush, run, paced)
                        # Last: the transient store they fill would weigh on the rows above.
                        paired += _transient_rows(gw, pids, per_process, row)
                elif topology == "embedded":
                    # A durable broker's puts wait for the group commit's fsync; its transient
                    # ones do not: what choosing durability per message buys there.
                    paired += ["", *_transient_rows(gw, pids, per_process, row, broker_flush=flush)]
    lines += ["", *paired]
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "services-latest.md").write_text("\n".join(lines) + "\n")
    return lines


def _transient_rows(
    gw: str,
    pids: Sequence[int],
    per_process: int,
    row: Callable[[str, str, str, service_bench.Medians], None],
    broker_flush: str = "ASYNC_FLUSH",
) -> list[str]:
    """Transient produce next to persistent in the same suite's life (issue "Durability
    classes"), on a broker of ``broker_flush``: batches of 256, and one message per call (on
    ASYNC_FLUSH 2 clients with 4 calls in flight each; on another broker one client sending one
    at a time, where what a persistent put waits for, an fsync, shows), to a persistent and to
    a transient topic, the runs interleaved: in each round each shape runs
    both topics back to back, the persistent one first in odd rounds and the transient one
    first in even rounds (the uncounted round 0 included), so that both meet the same store
    and the same machine. Transient messages are for consumers that keep up: after each
    transient run (not timed) a group reads what it put and the store frees it, as it would in
    use; without that the runs' 400 MB would be paged out to scratch. One round first, not
    counted, so that the transient store's first fill of the heap (pages the kernel zero-fills
    on first touch, reused from then on) is not taken for its steady cost; then TRANSIENT_RUNS
    rounds, the server's CPU per message measured in each. Returns the lines that compare the
    two round by round (each transient run over the persistent run of its round, just before
    or after it: the pairs that met the same moment of the machine)."""
    # shape -> (the run's words, producer processes, messages a process, batch, calls in flight)
    shapes = {"batches of 256": ("2 clients x 4 batches of 256 in flight", 2, per_process, 256, 4)}
    if broker_flush == "ASYNC_FLUSH":
        shapes["single messages"] = ("2 clients x 4 single messages in flight", 2, 4000, 1, 4)
    else:  # where a persistent put waits for its fsync, and a transient one does not
        shapes["one message at a time"] = ("1 client, one message at a time", 1, 2000, 1, 1)
    # The transient rows' flush column: "transient" on the ASYNC_FLUSH broker, as since the
    # table's first run; the broker named on another.
    transient = "transient" if broker_flush == "ASYNC_FLUSH" else f"transient, {broker_flush} broker"
    topics = {broker_flush: service_bench.TOPIC, transient: service_bench.TRANSIENT_TOPIC}
    runs: dict[tuple[str, str], list[service_bench.LoadResult]] = {}
    for round_no, counted in enumerate([False] + [True] * TRANSIENT_RUNS):
        for shape, (_, processes, count, batch, inflight) in shapes.items():
            # Which goes first alternates round by round: whatever one run leaves the next (the
            # flush of its dirty pages, a release round) then weighs on both alike.
            order = list(topics.items()) if round_no % 2 else list(topics.items())[::-1]
            for name, topic in order:
                result = service_bench.produce(
                    gw,
                    processes=processes,
                    per_process=count,
                    batch=batch,
                    inflight=inflight,
                    topic=topic,
                    server_pids=pids,
                )
                if counted:
                    runs.setdefault((shape, name), []).append(result)
                if topic == service_bench.TRANSIENT_TOPIC:
                    service_bench.consume(gw, "bench-transient-readers", result.messages, topic=topic)
                    time.sleep(2 * RELEASE_INTERVAL_S)  # a release round frees what it read
    for (shape, name), results in runs.items():
        row("embedded", name, f"produce, {shapes[shape][0]} (interleaved)", service_bench.Medians.of(results))
    out = [f"Transient over {broker_flush}, round by round (median, lowest-highest of the rounds):", ""]
    for shape in shapes:
        pairs = list(zip(runs[(shape, broker_flush)], runs[(shape, transient)], strict=True))
        cpu = [_ratio(t.server_us_per_msg, p.server_us_per_msg) for p, t in pairs]
        rate = [_ratio(t.msgs_per_s, p.msgs_per_s) for p, t in pairs]
        written = [_ratio(t.server_write_bytes_per_msg, p.server_write_bytes_per_msg) for p, t in pairs]
        out.append(
            f"- {shape}: server µs/msg {_spread(cpu)}, msgs/s {_spread(rate)}, "
            f"server written B/msg {_spread(written)}"
        )
    return out


def _ratio(a: float, b: float) -> float:
    """``a / b``; NaN when ``b`` is 0 or either was not measured (a data folder on tmpfs
    dirties nothing for storage, say)."""
    return a / b if b and not (math.isnan(a) or math.isnan(b)) else math.nan


def _spread(ratios: Sequence[float]) -> str:
    """``median (lowest-highest)`` of ``ratios``, as x-fold ratios; "not measured" when any
    ratio is NaN."""
    if any(math.isnan(r) for r in ratios):
        return "not measured"
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def _ha_suite(console: Console, data_dir: Path, facts: dict[str, str]) -> list[str]:
    """Produce under ASYNC_MASTER and SYNC_MASTER (each flush type) with a live slave; then the
    catch-up of an empty slave from a 1 GiB backlog."""
    lines = [
        f"Measured {facts['date']} on {facts['cpu']} ({facts['cores']} cores), Python {facts['python']}; "
        "master, slave, gateway and the load-generating clients share the cores.",
        "",
        "| broker role | flush | msgs/s | vs ASYNC_MASTER | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    per_process = 60_000
    rates: dict[str, float] = {}
    for flush in ("ASYNC_FLUSH", "SYNC_FLUSH"):
        for role in ("ASYNC_MASTER", "SYNC_MASTER"):
            with scratch_dir(data_dir, "ha-produce") as d, ha_bench.running_group(d, role, flush) as gw:
                r = service_bench.produce(gw, processes=2, per_process=per_process, batch=256, inflight=4)
            rates[role] = r.msgs_per_s
            ratio = r.msgs_per_s / rates["ASYNC_MASTER"] if "ASYNC_MASTER" in rates else float("nan")
            console.print(
                f"  {role} {flush}: {r.msgs_per_s:,.0f} msgs/s ({ratio:.2f}x), "
                f"p50 {r.pct(50):.1f} ms, p99 {r.pct(99):.1f} ms"
            )
            lines.append(
                f"| {role} | {flush} | {r.msgs_per_s:,.0f} | {ratio:.2f}x | "
                f"{r.pct(50):.1f} | {r.pct(99):.1f} |"
            )
    for role in ("ASYNC_MASTER", "SYNC_MASTER"):
        with scratch_dir(data_dir, "ha-paced") as d, ha_bench.running_group(d, role, "ASYNC_FLUSH") as gw:
            r = service_bench.produce(
                gw, processes=2, per_process=20_000, batch=32, inflight=16, rate=2_000.0
            )
        console.print(f"  {role} paced 4k/s: p50 {r.pct(50):.1f} ms, p99 {r.pct(99):.1f} ms")
        lines.append(
            f"| {role} | ASYNC_FLUSH, offered 4,000 msgs/s | {r.msgs_per_s:,.0f} | - | "
            f"{r.pct(50):.1f} | {r.pct(99):.1f} |"
        )
    lines += [
        "",
        "Load: 2 client processes x 4 Produce calls of 256 x 1 KiB in flight (records encoded by the "
        "client), 120,000 messages per run, through a gateway in front of the master; the paced rows "
        "send batches of 32 on a fixed schedule (latency from the scheduled send time).",
        "",
    ]
    with scratch_dir(data_dir, "ha-catch-up") as d:
        c = ha_bench.catch_up(d, 1 << 30)
    console.print(
        f"  catch-up of {c.backlog_bytes / 2**30:.2f} GiB: {c.seconds:.1f} s, {c.mb_per_s:,.0f} MB/s"
    )
    lines += [
        "| replication | result |",
        "|---|---|",
        f"| catch-up of an empty slave from a {c.backlog_bytes / 2**30:.2f} GiB backlog | {c.seconds:.1f} s "
        "(slave process start included) |",
        f"| replication throughput while catching up | {c.mb_per_s:,.0f} MB/s |",
    ]
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "ha-latest.md").write_text("\n".join(lines) + "\n")
    return lines


def _rocketmq_suite(console: Console, data_dir: Path, facts: dict[str, str]) -> list[str]:
    """The official RocketMQ 5 client's produce and consume rates over the gateway."""
    from bench import rocketmq_bench

    lines = [
        f"Measured {facts['date']} on {facts['cpu']} ({facts['cores']} cores), Python {facts['python']}; "
        "server and client processes share the cores; ASYNC_FLUSH.",
        "",
        "| topology | run | messages | msgs/s | body MB/s | errors |",
        "|---|---|---|---|---|---|",
    ]
    for topology in ("embedded", "split"):
        console.print(f"  rocketmq client, {topology} ...", end="")
        with scratch_dir(data_dir, f"rocketmq-{topology}") as d:
            produce, consume = rocketmq_bench.run(d, topology)
        console.print(f" produce {produce.msgs_per_s:,.0f} msgs/s, consume {consume.msgs_per_s:,.0f} msgs/s")
        for name, r in (
            ("produce: 2 Producers, send_async, 64 in flight", produce),
            ("consume: 2 SimpleConsumers, receive(32) + ack each", consume),
        ):
            lines.append(
                f"| {topology} | {name} | {r.messages:,} | {r.msgs_per_s:,.0f} "
                f"| {r.msgs_per_s * 1024 / 1e6:.1f} | {r.errors} |"
            )
    console.print("  rocketmq client one call at a time, gateway and do-nothing server ...", end="")
    with scratch_dir(data_dir, "rocketmq-ceiling") as d:
        ceilings = rocketmq_bench.ceiling(d)
    console.print(" " + ", ".join(f"{c.name} {c.ratio:.2f}x" for c in ceilings))
    lines += [
        "",
        "One client process, one call at a time (5 rounds; in each the embedded gateway and a "
        "MessagingService that answers at once and stores nothing (bench.floor_messaging), the ceiling "
        "the client itself sets, run back to back, which goes first alternating): medians of the rates, "
        "and of the rounds' ratios (target: 0.85x).",
        "",
        "| run | gateway msgs/s | do-nothing server msgs/s | gateway / ceiling (rounds: lowest-highest) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {c.name} | {c.gateway:,.0f} | {c.floor:,.0f} | {c.ratio:.2f} "
        f"({min(c.round_ratios, default=0):.2f}-{max(c.round_ratios, default=0):.2f}) |"
        for c in ceilings
    ]
    return lines


def _spark_suite(console: Console, data_dir: Path, facts: dict[str, str]) -> list[str]:
    """Batch reads of 1,000,000 1 KiB messages through both data sources, and the rebuild job."""
    from bench import spark_bench

    console.print("  spark: produce 1,000,000 messages, then read and rebuild ...")
    with scratch_dir(data_dir, "spark") as d:
        rows, notes = spark_bench.run(d)
    lines = [
        f"Measured {facts['date']} on {facts['cpu']} ({facts['cores']} cores), Python {facts['python']}; "
        f"Spark local[2] and the embedded suite share the cores; {notes['messages']} messages of 1 KiB, "
        f"{notes['commitlog_files']} CommitLog files of 1 GiB.",
        "",
        "| run | rows | seconds | rows/s | body MB/s |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        console.print(f"    {r.name}: {r.rows_per_s:,.0f} rows/s in {r.seconds:.1f} s")
        lines.append(f"| {r.name} | {r.rows:,} | {r.seconds:.1f} | {r.rows_per_s:,.0f} | {r.mb_per_s:.1f} |")
    return lines


def _peers_suite(console: Console, data_dir: Path, facts: dict[str, str], only: str) -> list[str]:
    """The same workload against mqstore, the bare-gRPC floor and the peers that are installed."""
    from bench import peer_bench

    return peer_bench.run(console, data_dir, facts, only)


def _recovery_suite(
    console: Console, data_dir: Path, facts: dict[str, str], sizes: tuple[float, ...]
) -> list[str]:
    """Clean and SIGKILL restarts of the embedded suite as one store grows (bench.recovery_bench)."""
    from bench import recovery_bench

    console.rule("recovery: restart time as the log grows")
    with scratch_dir(data_dir, "recovery") as d:
        results = recovery_bench.run(d, sizes)
    lines = [
        f"Measured {facts['date']} on {facts['cpu']} ({facts['cores']} cores), Python {facts['python']}, "
        f"data on `{facts['filesystem']}`; 1 KiB messages, 16 queues, one key each; the SIGKILL comes "
        f"after {recovery_bench.KILL_MESSAGES:,} more messages through the gateway.",
        "",
        "| log GiB | restart | until SERVING s | recovery | GiB validated | recovery s | s/GiB validated |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        per = f"{r.recovery_s / r.scanned_gib:.1f}" if r.scanned_gib > 0.01 else "-"
        lines.append(
            f"| {r.log_gib:.1f} | {r.kind} | {r.serving_s:.1f} | {r.recovery} | {r.scanned_gib:.3f} | "
            f"{r.recovery_s:.2f} | {per} |"
        )
    for line in lines:
        console.print(line, markup=False)
    return lines


def _retention_suite(console: Console, data_dir: Path, facts: dict[str, str]) -> list[str]:
    """Produce latency before and while a cleanup round deletes 100 expired segments
    (bench.retention_bench)."""
    from bench import retention_bench

    console.rule("retention: a cleanup round under produce")
    with scratch_dir(data_dir, "retention") as d:
        r = retention_bench.run(d)
    lines = [
        f"Measured {facts['date']} on {facts['cpu']} ({facts['cores']} cores), Python {facts['python']}, "
        f"data on `{facts['filesystem']}`; one client sends batches of 16 x 1 KiB one at a time while "
        f"the round deletes {r.segments} expired 4 MiB segments (and the ConsumeQueue and IndexFile "
        "files below them).",
        "",
        "| round s | sends during | p50 ms before | p99 ms before | p50 ms during | p99 ms during "
        "| p99 during / before |",
        "|---|---|---|---|---|---|---|",
        f"| {r.round_s:.1f} | {r.sends_during:,} | {r.p50_before:.2f} | {r.p99_before:.2f} | "
        f"{r.p50_during:.2f} | {r.p99_during:.2f} | {r.p99_ratio:.2f} |",
    ]
    for line in lines:
        console.print(line, markup=False)
    return lines


def _failover_suite(console: Console, data_dir: Path, facts: dict[str, str], rounds: int) -> list[str]:
    """A master SIGKILLed under load, ``rounds`` times (bench.failover_bench)."""
    from bench import failover_bench

    console.rule(f"failover: {rounds} masters SIGKILLed under load")
    with scratch_dir(data_dir, "failover") as d:
        r = failover_bench.run(d, rounds)
    lines = [
        f"Measured {facts['date']} on {facts['cpu']} ({facts['cores']} cores), Python {facts['python']}; "
        f"etcd, three commitlog members, a gateway and the producers share the cores; {rounds} rounds.",
        "",
        "| from the SIGKILL to | median s | worst s | target |",
        "|---|---|---|---|",
        f"| a member reports itself the master | {statistics.median(r.elected_s):.1f} | "
        f"{max(r.elected_s):.1f} | - |",
        f"| the first produce acknowledged again (SYNC_MASTER) | {r.median_ack_s:.1f} | "
        f"{r.worst_ack_s:.1f} | <= 10 |",
        "",
        f"{r.acknowledged:,} messages acknowledged over the rounds, every one of them in the final "
        "master's log at the offset its put reported.",
    ]
    for line in lines:
        console.print(line, markup=False)
    return lines


def _write_readme(block: str, lines: list[str]) -> None:
    """Replace the ``results:<block>`` section of bench/README.md with ``lines``."""
    begin, end = f"<!-- results:{block}:begin -->", f"<!-- results:{block}:end -->"
    text = README.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        raise SystemExit(f"{README} lacks the {begin} / {end} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    README.write_text(head + begin + "\n" + "\n".join(lines) + "\n" + end + tail, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
