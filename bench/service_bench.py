"""Service benchmarks over the gateway (issue "gRPC services, the embedded suite and the CLI").

The suite runs as real ``mqstore serve`` processes (embedded: one; split: four) on 127.0.0.1,
with its data under the benchmark folder. Load comes from separate client processes so the
server's cores are the ones measured:

* produce: each client process builds its Produce requests before the clock starts (1 KiB
  random bodies, the OpenMessaging Benchmark's shape: 1 topic, 16 queues; every message with its
  own UNIQ_KEY, so the commitlog's retry de-duplication never short-cuts a put), then keeps
  ``inflight`` batches outstanding; latency is per batch, send to acknowledgement.
* paced produce: batches scheduled at a fixed rate to offer a given msgs/s, at most ``inflight``
  outstanding per client; latency runs from each batch's scheduled send time to its
  acknowledgement, so a server that falls behind shows as latency (no coordinated omission).
* consume: a fresh group reads the first ``expected`` messages, 512 per pull, long polling,
  records decoded in the client, in a process whose allocator keeps freed heap
  (services.client.tune_allocator, as ``mqstore consume`` sets it).

The suite (bench.__main__) repeats each row and reports :class:`Medians`.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.harness import payload_pool, process_tree_cpu_s, process_write_bytes

REPO = Path(__file__).resolve().parents[1]
TOPIC = "bench-1kb"
TRANSIENT_TOPIC = "bench-1kb-transient"  # durability transient (libstore.durability)
QUEUES = 16
BODY = 1024


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class RunningSuite:
    """A started suite: the gateway's address and the pids of its ``mqstore serve`` processes."""

    address: str
    pids: tuple[int, ...]


@contextmanager
def running_suite(root: Path, topology: str, flush: str) -> Iterator[str]:
    """Start the suite (``embedded`` or ``split``) and yield the gateway address."""
    with running_processes(root, topology, flush) as suite:
        yield suite.address


@contextmanager
def running_processes(root: Path, topology: str, flush: str) -> Iterator[RunningSuite]:
    """Start the suite (``embedded`` or ``split``) with its data under ``root``; stop it on exit."""
    ports = {r: _free_port() for r in ("gateway", "commitlog", "dispatch", "index")}
    addr = {r: f"127.0.0.1:{p}" for r, p in ports.items()}
    common = ["--flush-disk-type", flush, "--set", f"defaultTopicQueueNums={QUEUES}"]
    roles = ["embedded"] if topology == "embedded" else ["commitlog", "dispatch", "index", "gateway"]
    procs = []
    for role in roles:
        listen = addr["gateway"] if role in ("embedded", "gateway") else addr[role]
        data = root / role
        args = [
            sys.executable,
            "-m",
            "services.cli",
            "--verbose",
            "serve",
            "--role",
            role,
            "--data",
            str(data),
            "--listen",
            listen,
            "--commitlog",
            addr["commitlog"],
            "--dispatch",
            addr["dispatch"],
            "--index",
            addr["index"],
            *common,
        ]
        log = open(root / f"{role}.log", "wb")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(args, cwd=REPO, stdout=log, stderr=log), log))
    try:
        from services.client import Admin

        with Admin(addr["gateway"]) as admin:
            admin.wait_until_serving(120)
            admin.create_topic(TOPIC, QUEUES)
            admin.create_topic(TRANSIENT_TOPIC, QUEUES, durability="transient")
        yield RunningSuite(addr["gateway"], tuple(proc.pid for proc, _ in procs))
    finally:
        for proc, log in reversed(procs):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


@dataclass
class LoadResult:
    messages: int
    seconds: float
    latencies_ms: list[float]
    pushed_back: int = 0  # calls refused with a retry hint (SYSTEM_BUSY) and sent again
    server_cpu_s: float = float("nan")  # CPU the server processes spent over the run (NaN: not measured)
    server_write_bytes: float = float("nan")  # bytes they dirtied for storage meanwhile (process_write_bytes)

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def server_us_per_msg(self) -> float:
        """Server CPU (user + system, every thread) per message, in µs; NaN when not measured."""
        return self.server_cpu_s / self.messages * 1e6 if self.messages else float("nan")

    @property
    def server_write_bytes_per_msg(self) -> float:
        """Bytes the server processes dirtied for storage per message; NaN when not measured."""
        return self.server_write_bytes / self.messages if self.messages else float("nan")

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


@dataclass(frozen=True)
class Medians:
    """One row over repeated runs: the medians of their msgs/s, p50 and p99 latency (ms),
    server CPU per message (µs) and bytes the server dirtied for storage per message, and the
    calls pushed back over all of them."""

    runs: int
    msgs_per_s: float
    p50: float
    p99: float
    pushed_back: int
    server_us_per_msg: float = float("nan")
    server_write_bytes_per_msg: float = float("nan")

    @classmethod
    def of(cls, results: Sequence[LoadResult]) -> Medians:
        """Raises ValueError for no results."""
        if not results:
            raise ValueError("no runs to take medians of")
        return cls(
            len(results),
            statistics.median(r.msgs_per_s for r in results),
            statistics.median(r.pct(50) for r in results),
            statistics.median(r.pct(99) for r in results),
            sum(r.pushed_back for r in results),
            statistics.median(r.server_us_per_msg for r in results),
            statistics.median(r.server_write_bytes_per_msg for r in results),
        )


def _build_requests(worker: int, total: int, batch: int, topic: str = TOPIC) -> list[bytes]:
    """Serialized Produce requests as the Python client sends them: records encoded client-side."""
    from services.client import OutgoingMessage, Producer

    pool = payload_pool(1 << 20, seed=b"bench-%d" % worker)
    producer = Producer.__new__(Producer)  # only its request builder: no connection needed
    Producer.__init__(producer, "127.0.0.1:1")
    out = []
    for start in range(0, total, batch):
        msgs = []
        for i in range(start, min(total, start + batch)):
            off = (i * 977) % (len(pool) - BODY)
            msgs.append(OutgoingMessage(topic, pool[off : off + BODY], tags="TagA"))
        out.append(producer._request(msgs).SerializeToString())
    producer.close()
    return out


def _produce_worker(
    address: str,
    worker: int,
    total: int,
    batch: int,
    inflight: int,
    rate: float,
    start_at: float,
    q: mp.Queue,
    topic: str = TOPIC,
) -> None:
    import threading

    import grpc

    from services._common.errors import retry_pushback_ms
    from services.proto import gateway_pb

    requests = _build_requests(worker, total, batch, topic)
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
    # Pre-serialized requests, bytes in and out: the load generator spends as little CPU as it can.
    produce_call = channel.unary_unary("/mqstore.v1.Gateway/Produce")
    latencies: list[float] = []
    slots = threading.Semaphore(inflight)  # paced runs too: a real client bounds what it has in flight
    done = threading.Event()
    remaining = [len(requests)]
    lock = threading.Lock()
    failed = [0]
    pushed = [0]
    reasons: dict[str, int] = {}
    pending: set[grpc.Future] = set()
    while time.time() < start_at:
        time.sleep(0.001)
    t0 = time.perf_counter()
    interval = batch / rate if rate > 0 else 0.0
    for n, request in enumerate(requests):
        slots.acquire()
        if interval:
            # Latency counts from the scheduled send time: a server that falls behind shows as
            # latency, not as a quietly lower offered rate (no coordinated omission).
            sent = t0 + n * interval
            delay = sent - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        else:
            sent = time.perf_counter()

        def start(request=request, sent=sent) -> None:
            fut = produce_call.future(request, timeout=60)
            with lock:
                pending.add(fut)  # a call future collected while in flight cancels its call
            fut.add_done_callback(lambda f: finished(f, request, sent))

        def finished(f, request, sent) -> None:
            reason = ""
            try:
                reply = gateway_pb.ProduceResponse.FromString(f.result())
                ok = reply.results.appended == reply.results.count and reply.results.status == 1
                if not ok:
                    res = reply.results
                    reason = f"status {res.status}, {res.appended}/{res.count} appended"
            except grpc.RpcError as err:
                hint = retry_pushback_ms(err)
                if err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and hint is not None:
                    # Pushed back (nothing written): send again after the hint, as a client
                    # would; the latency still counts from the scheduled send.
                    with lock:
                        pending.discard(f)
                        pushed[0] += 1
                    threading.Timer(hint / 1000.0, start, (request, sent)).start()
                    return
                ok = False
                reason = f"{err.code().name}: {err.details()} {err.debug_error_string()[:160]}"
            with lock:
                pending.discard(f)
                if reason:
                    reasons[reason] = reasons.get(reason, 0) + 1
                latencies.append((time.perf_counter() - sent) * 1000)
                failed[0] += 0 if ok else 1
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()
            slots.release()

        start()
    done.wait(300)
    seconds = time.perf_counter() - t0
    channel.close()
    q.put((total, seconds, latencies, failed[0], reasons, pushed[0]))


def produce(
    address: str,
    *,
    processes: int,
    per_process: int,
    batch: int,
    inflight: int = 4,
    rate: float = 0.0,
    topic: str = TOPIC,
    server_pids: Sequence[int] = (),
) -> LoadResult:
    """Produce to ``topic`` with ``processes`` client processes; ``rate`` (msgs/s per process)
    paces them. With ``server_pids``, the CPU those processes spend and the bytes they dirty for
    storage from the moment the clients start sending until the last is done are measured
    (LoadResult.server_cpu_s, server_write_bytes)."""
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    start_at = time.time() + 3.0 + per_process / 40_000  # time to build the requests
    workers = [
        ctx.Process(
            target=_produce_worker,
            args=(address, w, per_process, batch, inflight, rate, start_at, q, topic),
        )
        for w in range(processes)
    ]
    for w in workers:
        w.start()
    time.sleep(max(0.0, start_at - time.time()))  # the clients build their requests meanwhile
    cpu_before, written_before = _cpu_s(server_pids), _written(server_pids)
    results = [q.get(timeout=600) for _ in workers]
    server_cpu_s = _cpu_s(server_pids) - cpu_before
    server_write_bytes = _written(server_pids) - written_before
    for w in workers:
        w.join(30)
    failed = sum(r[3] for r in results)
    if failed:
        reasons: dict[str, int] = {}
        for r in results:
            for reason, n in r[4].items():
                reasons[reason] = reasons.get(reason, 0) + n
        raise RuntimeError(f"{failed} produce calls failed: {reasons}")
    return LoadResult(
        sum(r[0] for r in results),
        max(r[1] for r in results),
        [lat for r in results for lat in r[2]],
        sum(r[5] for r in results),
        server_cpu_s,
        server_write_bytes,
    )


def _cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds the processes ``pids`` have used so far; NaN for none."""
    return sum(process_tree_cpu_s(pid) for pid in pids) if pids else float("nan")


def _written(pids: Sequence[int]) -> float:
    """Bytes the processes ``pids`` have dirtied for storage so far; NaN for none."""
    return sum(process_write_bytes(pid) for pid in pids) if pids else float("nan")


def consume(
    address: str, group: str, expected: int, topic: str = TOPIC, server_pids: Sequence[int] = ()
) -> LoadResult:
    """Read ``expected`` messages of ``topic`` as ``group`` (a fresh group starts at the queues'
    beginning), then commit; latency is per poll. ``server_pids``: as for :func:`produce`."""
    from services.client import PullConsumer, tune_allocator

    tune_allocator()  # as `mqstore consume` does (module docstring)
    got = 0
    latencies: list[float] = []
    with PullConsumer(address, group, topic, batch_size=512, hold_ms=1000) as consumer:
        cpu_before, written_before = _cpu_s(server_pids), _written(server_pids)
        t0 = time.perf_counter()
        last = time.monotonic()
        while got < expected and time.monotonic() - last < 20:
            p0 = time.perf_counter()
            batch = consumer.poll(500)
            if batch:
                latencies.append((time.perf_counter() - p0) * 1000)
                got += len(batch)
                last = time.monotonic()
        seconds = time.perf_counter() - t0
        server_cpu_s = _cpu_s(server_pids) - cpu_before
        server_write_bytes = _written(server_pids) - written_before
        consumer.commit()
    if got < expected:
        raise RuntimeError(f"consumed {got} of {expected} messages")
    return LoadResult(
        got, seconds, latencies, server_cpu_s=server_cpu_s, server_write_bytes=server_write_bytes
    )
