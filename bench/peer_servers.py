"""The other brokers of the peers suite, each started from its Debian package's binary for one
run: a config and the data in a scratch folder, listening on 127.0.0.1 at a free port, stopped
(and its folder left to the caller to remove) afterwards.

* Redis 7 (``redis-server``): AOF on, ``appendfsync`` everysec or always, no RDB snapshots.
* NATS (``nats-server``): JetStream with the file store in the scratch folder.
* RabbitMQ 3 (``rabbitmq-server``, the script under /usr/lib/rabbitmq/bin, not Debian's wrapper
  that switches to the rabbitmq user): its own node name, Mnesia and log folders, cookie (HOME),
  config file and enabled-plugins file (rabbitmq_stream); AMQP, stream and Erlang distribution
  listeners on 127.0.0.1, and a private epmd on a free loopback port, stopped afterwards.

A broker that is not installed, or that does not start, raises :class:`PeerUnavailable` with the
reason; the suite reports it as skipped. Nothing here ever listens beyond 127.0.0.1.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from bench.service_bench import REPO, _free_port

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0  # a server not accepting connections after this long did not start (s)
STOP_TIMEOUT_S = 30.0  # SIGTERM, then SIGKILL after this long (s)
RABBITMQ_ATTEMPTS = 3  # RabbitMQ's start is the fragile one: fresh folders and ports each time
RABBITMQ_START_TIMEOUT_S = 120.0  # per attempt (s)
_SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")  # Debian puts nats-server here, off a user's PATH
_RABBITMQ_SCRIPTS = Path("/usr/lib/rabbitmq/bin")


class PeerUnavailable(Exception):
    """A broker (or its Python client) is missing or would not start; ``str()`` is the reason."""


@dataclass(frozen=True)
class PeerServer:
    """A started broker: its ports on 127.0.0.1 and the pid whose process tree is the server."""

    pid: int
    port: int
    extra_ports: dict[str, int]
    log: Path

    @property
    def host(self) -> str:
        """Always 127.0.0.1."""
        return HOST


def find_binary(name: str) -> str:
    """The path of ``name`` on PATH or in the sbin folders; PeerUnavailable when not installed."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    found = shutil.which(name, path=path)
    if found is None:
        raise PeerUnavailable(f"{name} is not installed (make bench-deps)")
    return found


def port_open(port: int, host: str = HOST) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def ports_open(ports: tuple[int, ...]) -> bool:
    """Whether something accepts connections on every one of ``ports`` (loopback)."""
    return all(port_open(port) for port in ports)


@contextmanager
def _process(
    args: list[str],
    log: Path,
    ready: Callable[[], bool],
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = START_TIMEOUT_S,
    cwd: Path | None = None,
) -> Iterator[int]:
    """Run ``args`` in a session of its own; yield its pid once ``ready()``; stop its process
    group at the end. PeerUnavailable (with the log's tail) when it exits or is not ready in time."""
    out = open(log, "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if proc.poll() is not None:
                raise PeerUnavailable(f"{Path(args[0]).name} exited with {proc.returncode}: {_tail(log)}")
            if time.monotonic() > deadline:
                raise PeerUnavailable(f"{Path(args[0]).name} not ready after {timeout_s:.0f} s: {_tail(log)}")
            time.sleep(0.2)
        yield proc.pid
    finally:
        _stop_group(proc)
        out.close()


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group ``proc`` leads (started in a session of its own), SIGKILL it when
    any member is still there after STOP_TIMEOUT_S."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        proc.poll()  # reaps the leader, which otherwise keeps the group alive as a zombie
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _tail(log: Path, lines: int = 5) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(line.strip() for line in text[-lines:]) or "(empty log)"


@contextmanager
def redis_server(root: Path, appendfsync: str) -> Iterator[PeerServer]:
    """redis-server with the append-only file on (``appendfsync`` everysec or always) in ``root``."""
    binary = find_binary("redis-server")
    port = _free_port()
    args = [
        binary,
        "--bind", HOST,
        "--port", str(port),
        "--protected-mode", "yes",
        "--dir", str(root),
        "--appendonly", "yes",
        "--appendfsync", appendfsync,
        "--save", "",
        "--daemonize", "no",
    ]  # fmt: skip
    log = root / "redis.log"
    with _process(args, log, lambda: port_open(port)) as pid:
        yield PeerServer(pid, port, {}, log)


@contextmanager
def nats_server(root: Path) -> Iterator[PeerServer]:
    """nats-server with JetStream, its file store in ``root``."""
    binary = find_binary("nats-server")
    port = _free_port()
    store = root / "jetstream"
    store.mkdir()
    args = [binary, "-js", "-sd", str(store), "-a", HOST, "-p", str(port)]
    log = root / "nats.log"
    with _process(args, log, lambda: port_open(port)) as pid:
        yield PeerServer(pid, port, {}, log)


def rabbitmq_script() -> Path:
    """RabbitMQ's own start script (not Debian's /usr/sbin wrapper, which runs it as the rabbitmq
    user with the system's folders); PeerUnavailable when RabbitMQ is not installed."""
    script = _RABBITMQ_SCRIPTS / "rabbitmq-server"
    if script.is_file():
        return script
    found = Path(find_binary("rabbitmq-server")).resolve()
    sibling = found.parent / "rabbitmq-server"
    if found.name == "rabbitmq-script-wrapper" or not sibling.is_file():
        raise PeerUnavailable(f"RabbitMQ's start script not found next to {found}")
    return sibling


@contextmanager
def rabbitmq_server(root: Path) -> Iterator[PeerServer]:
    """rabbitmq-server with the stream plugin; ``port`` is AMQP, ``extra_ports["stream"]`` the
    stream protocol. Tries RABBITMQ_ATTEMPTS times (fresh folder and ports) before giving up."""
    script = rabbitmq_script()
    reasons = []
    for attempt in range(RABBITMQ_ATTEMPTS):
        home = root / f"rabbitmq-{attempt}"
        home.mkdir()
        ports = {name: _free_port() for name in ("amqp", "stream", "dist", "epmd")}
        env = _rabbitmq_env(home, ports)
        with ExitStack() as stack:
            stack.callback(_stop_epmd, ports["epmd"], env)  # after the node has stopped
            try:
                pid = stack.enter_context(
                    _process(
                        [str(script)],
                        home / "server.log",
                        functools.partial(ports_open, (ports["amqp"], ports["stream"])),
                        env=env,
                        cwd=home,
                        timeout_s=RABBITMQ_START_TIMEOUT_S,
                    )
                )
            except PeerUnavailable as exc:
                reasons.append(f"attempt {attempt + 1}: {exc}")
                continue
            yield PeerServer(pid, ports["amqp"], {"stream": ports["stream"]}, home / "server.log")
            return
    raise PeerUnavailable("rabbitmq-server did not start: " + "; ".join(reasons))


def _rabbitmq_env(home: Path, ports: dict[str, int]) -> dict[str, str]:
    config = home / "rabbitmq.conf"
    config.write_text(
        "\n".join(
            [
                f"listeners.tcp.default = {HOST}:{ports['amqp']}",
                f"stream.listeners.tcp.1 = {HOST}:{ports['stream']}",
                f"stream.advertised_host = {HOST}",
                f"stream.advertised_port = {ports['stream']}",
                "",
            ]
        )
    )
    plugins = home / "enabled_plugins"
    plugins.write_text("[rabbitmq_stream].\n")
    conf_env = home / "rabbitmq-env.conf"
    conf_env.write_text("")  # not /etc/rabbitmq/rabbitmq-env.conf
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
    env.update(
        HOME=str(home),  # the Erlang cookie is made here
        RABBITMQ_CONF_ENV_FILE=str(conf_env),
        RABBITMQ_NODENAME=f"bench{ports['amqp']}@localhost",
        RABBITMQ_NODE_IP_ADDRESS=HOST,
        RABBITMQ_NODE_PORT=str(ports["amqp"]),
        RABBITMQ_DIST_PORT=str(ports["dist"]),
        RABBITMQ_CONFIG_FILE=str(config),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(plugins),
        RABBITMQ_MNESIA_BASE=str(home / "mnesia"),
        RABBITMQ_LOG_BASE=str(home / "log"),
        RABBITMQ_PLUGINS_EXPAND_DIR=str(home / "plugins-expand"),
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
        ERL_EPMD_ADDRESS=HOST,
        ERL_EPMD_PORT=str(ports["epmd"]),
    )
    return env


def _stop_epmd(port: int, env: dict[str, str]) -> None:
    """Stop the epmd the node started on its private ``port`` (it outlives the node)."""
    epmd = shutil.which("epmd") or "/usr/bin/epmd"
    if port_open(port) and Path(epmd).exists():
        subprocess.run(
            [epmd, "-port", str(port), "-kill"], env=env, capture_output=True, check=False, timeout=10
        )


@contextmanager
def _floor(root: Path, module: str) -> Iterator[PeerServer]:
    """A do-nothing server (``python -m <module> --listen``) as a process of its own."""
    port = _free_port()
    args = [sys.executable, "-m", module, "--listen", f"{HOST}:{port}"]
    log = root / f"{module.rpartition('.')[2]}.log"
    with _process(args, log, lambda: port_open(port), cwd=REPO) as pid:
        yield PeerServer(pid, port, {}, log)


def floor_messaging(root: Path) -> AbstractContextManager[PeerServer]:
    """The do-nothing RocketMQ 5 MessagingService (bench.floor_messaging)."""
    return _floor(root, "bench.floor_messaging")


def floor_server(root: Path) -> AbstractContextManager[PeerServer]:
    """The do-nothing Gateway (bench.floor_server)."""
    return _floor(root, "bench.floor_server")
