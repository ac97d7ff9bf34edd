"""Real services for tests: in-process suites on their own event-loop thread, and the split
topology as four ``mqstore serve --role`` processes, all on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from services._common import event_loop
from services._common.tls import TlsConfig
from services.client import Admin, PullConsumer
from services.serve import ServeOptions, Suite

REPO = Path(__file__).resolve().parents[2]
SMALL_STORE = {
    "mappedFileSizeCommitLog": 8 * 1024 * 1024,
    "maxMessageSize": 1024 * 1024,
    "mappedFileSizeConsumeQueue": 20 * 10_000,
    "maxHashSlotNum": 10_007,
    "maxIndexNum": 40_000,
    "defaultTopicQueueNums": 4,
    "flushIntervalConsumeQueue": 200,
    "flushConsumeQueueThoroughInterval": 1000,
    # Retention by disk usage is tested with a usage of its own (tests/unit/libstore/
    # test_commit_log_cleaner.py); these suites must not depend on how full the host's disk is.
    "diskMaxUsedSpaceRatio": 99,
    "diskSpaceCleanForciblyRatio": 99,
    "diskSpaceWarningLevelRatio": 99,
    # Receives hidden for a few seconds, so redeliveries come fast (RocketMQ's default floor is
    # 10 s; its own integration tests lower it too).
    "minInvisibleTimeMillsForRecv": 1000,
}


_HANDED_OUT: set[int] = set()
# free_port's ports lie below Linux's ephemeral range (32768-60999 by default), where the kernel
# never picks one for a client's connect() or a bind to port 0, in one block per test worker
# (pytest-xdist's PYTEST_XDIST_WORKER, gw0, gw1, ...): two workers never hand out the same port,
# and no connection made meanwhile can take a port before the server it was meant for binds it.
_PORT_BASE = 20_000
_PORTS_PER_WORKER = 1_500


def _port_block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    start = _PORT_BASE + (index % 8) * _PORTS_PER_WORKER
    return range(start, start + _PORTS_PER_WORKER)


def free_port() -> int:
    """A loopback port nothing listens on now, nor on the port after it (a commitlog's HA
    listener takes its port + 1), from this test worker's own block (see _PORT_BASE): an even
    port, so that two handed out never overlap; one this process has not handed out before
    while the block has such ports left (two servers of one test must not share one).

    Only for a server whose address must be known before it starts or must stay the same
    across a restart: cluster members that name each other (--ha-peers, etcd peer URLs), and
    a member killed and started again where its peers and the gateway still reach for it.
    A port the kernel picked (bind to port 0) is in the ephemeral range, where a client's
    connect() may take it between the kill and the restart. Every other server binds port 0:
    in-process suites read ``Suite.address``, processes :meth:`ServeProcess.bound_address`.
    Raises RuntimeError when every port of the block is in use."""
    block = _port_block()
    pairs = len(block) // 2
    first = random.randrange(pairs)
    for fresh_only in (True, False):
        for k in range(pairs):
            port = block.start + 2 * ((first + k) % pairs)
            if fresh_only and port in _HANDED_OUT:
                continue
            if _bindable(port) and _bindable(port + 1):
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError(f"no free loopback port left in {block.start}-{block.stop - 1}")


@contextlib.contextmanager
def refusing_address() -> Iterator[str]:
    """A loopback host:port that refuses connections for as long as the block runs: a socket
    bound to a port the kernel picked, never listening (nothing else can bind it meanwhile).
    For tests of what a client does when nobody serves."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False  # in use: by this run or by something else on the machine
    return True


def poll_until(
    consumer: PullConsumer,
    want: int | None,
    timeout_s: float,
    *,
    idle_s: float | None = None,
    poll_ms: int = 500,
    on_batch: Any = None,
) -> list:
    """Poll ``consumer`` until it gave ``want`` records (None: no count), ``timeout_s`` passed,
    or (with ``idle_s``) nothing came for that long. ``on_batch(batch)`` runs after each
    non-empty batch. Returns the records; callers assert on how many they need."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    last = time.monotonic()
    while (want is None or len(got) < want) and time.monotonic() < deadline:
        if idle_s is not None and time.monotonic() - last >= idle_s:
            break
        batch = consumer.poll(poll_ms)
        if batch:
            got += batch
            last = time.monotonic()
            if on_batch is not None:
                on_batch(batch)
    return got


Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(address: str) -> Samples:
    """Every sample of the endpoint at ``address``, by sample name (``*_total``, ``*_count``...)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [v for lab, v in samples.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, f"{name} {labels}: {found} among {samples.get(name)}"
    return found[0]


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll ``condition`` every 20 ms until it holds; AssertionError naming ``what`` after
    ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def derived_files(root: Path) -> dict[str, Any]:
    """The bytes of every ConsumeQueue file (by path under ``root``) and of every IndexFile."""
    cq = {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("consumequeue/*/*/*"))
        if p.name.isdigit()
    }
    index = [p.read_bytes() for p in sorted((root / "index" / "index").iterdir()) if p.name.isdigit()]
    return {"cq": cq, "index": index}


def wait_derived_caught_up(suite: Suite, timeout_s: float = 30.0) -> None:
    """Wait until the suite's dispatch and index followers reached the log's confirm offset."""
    assert suite.commit_log is not None and suite.dispatch_app and suite.index_app
    deadline = time.monotonic() + timeout_s
    end = suite.commit_log.confirm_offset
    followers = suite.dispatch_app.follower, suite.index_app.follower
    assert followers[0] is not None and followers[1] is not None, "the derived services have started"
    while time.monotonic() < deadline:
        if min(followers[0].reput_offset, followers[1].reput_offset) >= end:
            return
        time.sleep(0.02)
    raise AssertionError("dispatch/index did not catch up")


class LoopThread:
    """An asyncio loop on a daemon thread, the kind ``mqstore serve`` runs
    (services._common.event_loop); ``run(coro)`` executes a coroutine there."""

    def __init__(self) -> None:
        self.loop = event_loop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout_s: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class InProcessSuites:
    """Suites (one embedded, or several roles wired remotely) running in this process."""

    def __init__(self) -> None:
        self.loop = LoopThread()
        self.suites: list[Suite] = []

    def start(self, options: ServeOptions) -> Suite:
        suite = Suite(options)
        self.loop.run(suite.start())
        self.suites.append(suite)
        return suite

    def wait_ready(self, suite: Suite, timeout_s: float = 60.0) -> None:
        self.loop.run(suite.wait_ready(timeout_s), timeout_s + 5)

    def stop(self, suite: Suite) -> None:
        self.loop.run(suite.stop())
        self.suites.remove(suite)

    def close(self) -> None:
        for suite in reversed(list(self.suites)):
            self.stop(suite)
        self.loop.close()


def rebuild_derived(
    suites: InProcessSuites, options: ServeOptions, root: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """With the suite over ``root`` stopped: its derived files, then the derived files a fresh
    start rebuilds from the log after dispatch's and index's data are deleted."""
    built = derived_files(root)
    shutil.rmtree(root / "dispatch")
    shutil.rmtree(root / "index")
    suite = suites.start(options)
    suites.wait_ready(suite)
    wait_derived_caught_up(suite)
    suites.stop(suite)
    return built, derived_files(root)


class ServeProcess:
    """One ``mqstore serve`` process."""

    def __init__(
        self,
        args: list[str],
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        *,
        launcher: Sequence[str] = ("-m", "services.cli", "--verbose", "serve"),
    ) -> None:
        self.args = args
        self.log_path = log
        self._log_from = log.stat().st_size if log is not None and log.exists() else 0  # this run's
        self._log = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed in stop
        self.proc = subprocess.Popen(
            [sys.executable, *launcher, *args],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
            stdout=self._log,
            stderr=self._log,
        )

    def terminate(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        finally:
            self._close_log()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self._close_log()

    def _close_log(self) -> None:
        if not isinstance(self._log, int):
            self._log.close()

    def tail_log(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path else ""

    def metrics_address(self, timeout_s: float = 60.0) -> str:
        """The host:port of the process's Prometheus endpoint (``--metrics-listen``), as bound."""
        return self.bound_address("Prometheus metrics on http://", timeout_s)

    def bound_address(self, what: str = "serving on", timeout_s: float = 60.0) -> str:
        """The host:port the process says it bound, from the first line this process logged
        (a log shared with earlier runs is read from where this one began) that reads
        ``what`` then an address: "serving on" for its gRPC port, "Prometheus metrics on
        http://" for its scrape endpoint. For ``--listen
        127.0.0.1:0``: the kernel picks the port, so no other test can hold it. AssertionError
        (with the log's tail) when the process exits or ``timeout_s`` passes first."""
        assert self.log_path is not None, "bound_address reads the process's log"
        pattern = re.compile(re.escape(what) + r" ?(\d+\.\d+\.\d+\.\d+:\d+)")
        deadline = time.monotonic() + timeout_s
        while True:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_from)
                found = pattern.search(f.read().decode(errors="replace"))
            if found:
                return found.group(1)
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {what!r} address in the log\n{self.tail_log()}")
            time.sleep(0.02)


class SplitCluster:
    """commitlog, dispatch, index and gateway as four processes under ``root``."""

    def __init__(
        self,
        root: Path,
        store: Mapping[str, Any] | None = None,
        flush: str = "ASYNC_FLUSH",
        gateway_args: Sequence[str] = (),
        common_args: Sequence[str] = (),
        tls: TlsConfig | None = None,
        role_args: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.root = root
        self.gateway_args = list(gateway_args)
        self.common_args = list(common_args)  # every role (e.g. --tls-cert ...)
        self.role_args = {role: list(args) for role, args in (role_args or {}).items()}  # one role's
        self.tls = tls  # what wait_serving's health checks connect with
        self.ports = {role: free_port() for role in ("commitlog", "dispatch", "index", "gateway")}
        self.store = {**SMALL_STORE, **(store or {})}
        self.flush = flush
        self.procs: dict[str, ServeProcess] = {}

    @property
    def gateway(self) -> str:
        return f"127.0.0.1:{self.ports['gateway']}"

    def address(self, role: str) -> str:
        return f"127.0.0.1:{self.ports[role]}"

    def start(self, role: str) -> ServeProcess:
        args = [
            "--role",
            role,
            "--data",
            str(self.root / role),
            "--listen",
            self.address(role),
            "--commitlog",
            self.address("commitlog"),
            "--dispatch",
            self.address("dispatch"),
            "--index",
            self.address("index"),
            "--flush-disk-type",
            self.flush,
        ]
        for key, value in self.store.items():
            args += ["--set", f"{key}={value}"]
        args += self.common_args + self.role_args.get(role, [])
        if role == "gateway":
            args += self.gateway_args
        proc = ServeProcess(args, log=self.root / f"{role}.log")
        self.procs[role] = proc
        return proc

    def start_all(self, timeout_s: float = 60.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for role in ("commitlog", "dispatch", "index", "gateway"):
            self.start(role)
        self.wait_serving(timeout_s)

    def wait_serving(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for role in ("commitlog", "dispatch", "index", "gateway"):
            with Admin(self.address(role), tls=self.tls) as admin:
                try:
                    admin.wait_until_serving(max(1.0, deadline - time.monotonic()))
                except Exception as exc:
                    proc = self.procs.get(role)
                    log = proc.tail_log() if proc else ""
                    raise AssertionError(f"{role} is not serving: {exc}\n{log}") from exc

    def stop_all(self) -> None:
        for role in ("gateway", "index", "dispatch", "commitlog"):
            proc = self.procs.pop(role, None)
            if proc is not None:
                proc.terminate()


def v2_signed(
    ak: str, sk: str, date_time: str | None = None, client_id: str = "test@1"
) -> list[tuple[str, str]]:
    """RocketMQ 5 call metadata signed as the official clients sign (MQv2-HMAC-SHA1 over
    x-mq-date-time, their local time with a Z unless ``date_time`` is given)."""
    stamp = date_time or time.strftime("%Y%m%dT%H%M%SZ")
    signature = hmac.new(sk.encode(), stamp.encode(), hashlib.sha1).hexdigest()
    return [
        ("x-mq-client-id", client_id),
        ("x-mq-date-time", stamp),
        (
            "authorization",
            f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={signature}",
        ),
    ]


def v2_receive_request(
    topic: str, group: str, *, batch: int = 16, invisible_ms: int = 30_000, wait_ms: int = 1000
) -> Any:
    """A RocketMQ 5 ReceiveMessageRequest as the official client sends it (any queue, TAG
    ``*``), with ``invisible_ms`` and a long poll of ``wait_ms``."""
    from google.protobuf.duration_pb2 import Duration

    from services.gateway.rocketmq.pb import definition, service

    def duration(ms: int) -> Duration:
        return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)

    return service.ReceiveMessageRequest(
        group=definition.Resource(name=group),
        message_queue=definition.MessageQueue(topic=definition.Resource(name=topic), id=-1),
        filter_expression=definition.FilterExpression(type=definition.TAG, expression="*"),
        batch_size=batch,
        invisible_duration=duration(invisible_ms),
        long_polling_timeout=duration(wait_ms),
    )


def shared_receipt_key(root: Path) -> Path:
    """A receipt key file for a broker group's dispatch services (services.dispatch.receipt_signer),
    made under ``root``: members share it, so handles stay valid across a failover."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "receipt.key"
    if not path.exists():
        path.write_text(secrets.token_hex(32))
    return path


class BrokerGroupCluster:
    """One broker group as processes under ``root``: commitlog members ("a", "b", ...) with
    their own HA endpoints, optionally each with its dispatch and index, and a gateway over all
    members. Member "a" is configured as the master (``master_role``), the others as SLAVEs;
    every member lists the others as HA peers."""

    def __init__(
        self,
        root: Path,
        names: tuple[str, ...] = ("a", "b"),
        *,
        master_role: str = "SYNC_MASTER",
        flush: str = "ASYNC_FLUSH",
        store: Mapping[str, Any] | None = None,
        etcd: str = "",
    ) -> None:
        self.root = root
        self.names = names
        self.master_role = master_role
        self.flush = flush
        # With etcd endpoints the members elect their master (--election etcd): none is
        # configured as master or slave, each would become ``master_role`` when elected.
        self.etcd = etcd
        # autoCreateTopicEnable: off by default for split roles; these tests produce to topics
        # they do not create.
        self.store = {
            **SMALL_STORE,
            "autoCreateTopicEnable": "true",
            "slaveTimeout": 1000,
            "haSendHeartbeatInterval": 1000,
            **(store or {}),
        }
        if "popReceiptKeyFile" not in self.store:  # one key for the group, as deployments share one
            self.store["popReceiptKeyFile"] = str(shared_receipt_key(root))
        self.ports = {
            name: {svc: free_port() for svc in ("commitlog", "ha", "dispatch", "index")} for name in names
        }
        self.gateway_port = free_port()
        self.procs: dict[str, ServeProcess] = {}

    def address(self, name: str, svc: str = "commitlog") -> str:
        return f"127.0.0.1:{self.ports[name][svc]}"

    @property
    def gateway(self) -> str:
        return f"127.0.0.1:{self.gateway_port}"

    def _store_args(self) -> list[str]:
        args = ["--flush-disk-type", self.flush]
        for key, value in self.store.items():
            args += ["--set", f"{key}={value}"]
        return args

    def start_commitlog(self, name: str, *, role: str | None = None) -> ServeProcess:
        index = self.names.index(name)
        master = self.names[0]
        role = role or (self.master_role if name == master else "SLAVE")
        peers = ",".join(self.address(n) for n in self.names if n != name)
        args = [
            "--role",
            "commitlog",
            "--data",
            str(self.root / name / "commitlog"),
            "--listen",
            self.address(name),
            "--ha-listen",
            self.address(name, "ha"),
            "--broker-id",
            str(index),
            "--ha-peers",
            peers,
            *self._store_args(),
            "--set",
            f"storeHost={self.address(name)}",  # message ids tell which member stored a message
        ]
        if self.etcd:
            args += ["--election", "etcd", "--etcd", self.etcd, "--master-role", self.master_role]
        else:
            args += ["--broker-role", role]
            if role == "SLAVE":
                args += ["--ha-master", self.address(master, "ha")]
        self.root.mkdir(parents=True, exist_ok=True)
        proc = ServeProcess(args, log=self.root / f"{name}-commitlog.log")
        self.procs[f"{name}-commitlog"] = proc
        return proc

    def start_derived(self, name: str) -> None:
        for svc in ("dispatch", "index"):
            args = [
                "--role",
                svc,
                "--data",
                str(self.root / name / svc),
                "--listen",
                self.address(name, svc),
                "--commitlog",
                self.address(name),
                *self._store_args(),
            ]
            self.procs[f"{name}-{svc}"] = ServeProcess(args, log=self.root / f"{name}-{svc}.log")

    def start_gateway(self) -> None:
        args = ["--role", "gateway", "--data", str(self.root / "gateway"), "--listen", self.gateway]
        for svc in ("commitlog", "dispatch", "index"):
            args += [f"--{svc}", ",".join(self.address(n, svc) for n in self.names)]
        self.procs["gateway"] = ServeProcess([*args, *self._store_args()], log=self.root / "gateway.log")

    def start_all(self, *, derived: bool = False, timeout_s: float = 60.0) -> None:
        """Every member's commitlog (and, with ``derived``, its dispatch and index), then the
        gateway; waits until all serve."""
        for name in self.names:
            self.start_commitlog(name)
            if derived:
                self.start_derived(name)
        self.start_gateway()
        self.wait_serving(timeout_s=timeout_s)

    def wait_serving(self, keys: list[str] | None = None, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for key in keys or list(self.procs):
            name, _, svc = key.partition("-")
            address = self.gateway if key == "gateway" else self.address(name, svc)
            with Admin(address) as admin:
                try:
                    admin.wait_until_serving(max(1.0, deadline - time.monotonic()))
                except Exception as exc:
                    proc = self.procs.get(key)
                    raise AssertionError(
                        f"{key} is not serving: {exc}\n{proc.tail_log() if proc else ''}"
                    ) from exc

    def kill(self, key: str) -> None:
        self.procs.pop(key).kill()

    def signal(self, key: str, sig: signal.Signals) -> None:
        self.procs[key].proc.send_signal(sig)

    def stop_all(self) -> None:
        for key in ["gateway", *[k for k in self.procs if not k.endswith("commitlog")]]:
            proc = self.procs.pop(key, None)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.proc.send_signal(signal.SIGCONT)
                    proc.terminate()
        for key in list(self.procs):
            proc = self.procs.pop(key)
            proc.proc.send_signal(signal.SIGCONT)
            proc.terminate()

    def commitlog_files(self, name: str) -> Path:
        return self.root / name / "commitlog" / "commitlog"

    def master(self, among: Sequence[str] | None = None, timeout_s: float = 30.0) -> str:
        """The member that is the master now (by its HA state), waiting for one."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name in among or self.names:
                if f"{name}-commitlog" not in self.procs:
                    continue
                try:
                    with CommitLogAdmin(self.address(name)) as admin:
                        if admin.state().broker_role != "SLAVE":
                            return name
                except Exception:  # down or starting
                    continue
            time.sleep(0.1)
        raise AssertionError(f"no master among {among or self.names} within {timeout_s} s")


class CommitLogAdmin:
    """Synchronous calls to one commitlog service (HA state, role switch, raw reads)."""

    def __init__(self, address: str) -> None:
        import grpc

        from services.proto import commitlog_grpc

        self.channel = grpc.insecure_channel(address)
        self.stub = commitlog_grpc.CommitLogServiceStub(self.channel)

    def __enter__(self) -> CommitLogAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()

    def state(self) -> Any:
        from services.proto import commitlog_pb

        return self.stub.GetHAState(commitlog_pb.GetHAStateRequest(), timeout=5)

    def promote(self, role: str = "", force: bool = False) -> Any:
        from services.proto import commitlog_pb

        return self.stub.Promote(commitlog_pb.PromoteRequest(broker_role=role, force=force), timeout=30)

    def append(self, topic: str, body: bytes) -> Any:
        """Append one message; raises the StoreError the service answered with."""
        import grpc

        from services._common.errors import store_error_from_rpc
        from services.proto import commitlog_pb, common_pb

        request = commitlog_pb.AppendRequest(messages=[common_pb.Message(topic=topic, queue_id=0, body=body)])
        try:
            return self.stub.Append(request, timeout=10).results
        except grpc.RpcError as err:
            mapped = store_error_from_rpc(err)
            if mapped is not None:
                raise mapped from None
            raise

    def append_keyed(self, topic: str, keys: Sequence[str], body_size: int = 200) -> Any:
        """Append one message per key (the key repeated as its body, ``body_size`` bytes), as one
        batch, queue 0; returns the libstore PutMessageResults."""
        from services._common.convert import results_from_pb
        from services.proto import commitlog_pb, common_pb

        messages = [
            common_pb.Message(
                topic=topic, queue_id=0, properties={"KEYS": k}, body=(k.encode() * body_size)[:body_size]
            )
            for k in keys
        ]
        reply = self.stub.Append(commitlog_pb.AppendRequest(messages=messages), timeout=30)
        return results_from_pb(reply.results)

    def read(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The records at ``ranges``, in as many Read calls as the service's caps ask."""
        from services.commitlog.read_plan import plan_reads
        from services.proto import commitlog_pb

        out: list[bytes] = []
        for chunk in plan_reads(ranges):
            request = commitlog_pb.ReadRequest(offsets=[o for o, _ in chunk], sizes=[s for _, s in chunk])
            out += self.stub.Read(request, timeout=30).records
        return out

    def wait_for(self, predicate: Any, timeout_s: float = 30.0, what: str = "state") -> Any:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.state()
            except Exception as exc:  # not up yet
                last = exc
            else:
                if predicate(last):
                    return last
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last: {last}")


def assert_logs_identical(first: Path, second: Path, end_offset: int) -> int:
    """Every CommitLog segment holding bytes before ``end_offset`` is byte-identical in both
    folders; segments starting at or past it hold only zeros (pre-allocated). Returns how many
    segments were compared."""
    names = sorted({p.name for p in first.iterdir()} | {p.name for p in second.iterdir()})
    compared = 0
    for name in names:
        a, b = first / name, second / name
        if int(name) >= end_offset:
            for f in (a, b):
                if f.exists():
                    assert not f.read_bytes().strip(b"\0"), f"{f} past the log end holds data"
            continue
        assert a.exists() and b.exists(), f"segment {name} is missing on one side"
        assert a.read_bytes() == b.read_bytes(), f"segment {name} differs between {first} and {second}"
        compared += 1
    return compared
