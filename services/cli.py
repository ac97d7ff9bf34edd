"""The ``mqstore`` command line (typer). Bad input gives a one-line error and exit code 2; a
store or connection failure exit code 1; never a traceback.

    mqstore serve                          the embedded suite (gateway on 127.0.0.1:8081, ./data)
    mqstore serve --role commitlog|dispatch|index|gateway ...   one service of the split topology
    mqstore produce --topic T --count N --size B    (or --file F, or --stdin: one message per line)
    mqstore consume --group G --topic T [--tags "a || b"] [--output F]
    mqstore query --topic T --key K | --id MSGID | --time MS
    mqstore topic create T --queues 16 ; mqstore topic list
    mqstore progress --group G --topic T ; mqstore stats
    mqstore ha state|promote|demote --commitlog HOST:PORT ...   replication roles
    mqstore demo                           the libstore demo (no services)

Options of ``serve`` also come from MQSTORE_* environment variables (MQSTORE_ROLE,
MQSTORE_DATA_DIR, MQSTORE_LISTEN, ...); store keys from ``--set key=value``, MQSTORE_<FIELD> and
``--config`` (a broker.conf), in that order of precedence.

TLS (services._common.tls): ``serve --tls-cert/--tls-key/--tls-ca`` (MQSTORE_TLS_CERT/KEY/CA);
the client commands take the same files before the command name (``mqstore --tls-ca ca.pem
topic list``) or from the same variables: the CA to verify the server, and a client certificate
for ports that require one (``ha`` commands under mutual TLS, a ``--tls-client-ca`` gateway).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import grpc
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from libstore import (
    BrokerRole,
    ConfigError,
    FlushDiskType,
    ServiceNotAvailableError,
    StoreConfig,
    StoreError,
    TopicConfig,
)
from services._common import event_loop
from services._common.tls import TlsConfig

app = typer.Typer(add_completion=False, no_args_is_help=True, help="mqstore: a RocketMQ-style message store")
topic_app = typer.Typer(no_args_is_help=True, help="create, update, delete and list topics")
app.add_typer(topic_app, name="topic")
group_app = typer.Typer(no_args_is_help=True, help="create consumer groups")
app.add_typer(group_app, name="group")
ha_app = typer.Typer(no_args_is_help=True, help="replication: state of a commitlog service, role switch")
app.add_typer(ha_app, name="ha")
spark_app = typer.Typer(
    no_args_is_help=True, help="Spark jobs over a store's CommitLog files (local[*] or a cluster)"
)
app.add_typer(spark_app, name="spark")
console = Console()
err_console = Console(stderr=True)

AddressOpt = Annotated[
    str, typer.Option("--address", "-a", envvar="MQSTORE_ADDRESS", help="gateway host:port")
]
DEFAULT_GATEWAY = "127.0.0.1:8081"


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"error: {message}", markup=False, highlight=False)
    return typer.Exit(code)


class _Errors:
    """Turn store and RPC failures into one-line errors."""

    def __init__(self, address: str = "") -> None:
        self.address = address

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, ServiceNotAvailableError):
            raise _fail(f"{self.address} is not available: {exc}", 1)
        if isinstance(exc, StoreError):
            raise _fail(str(exc), 1 if type(exc).reason == "STORE_IO_ERROR" else 2)
        if isinstance(exc, grpc.RpcError):
            raise _fail(f"{self.address}: {exc.code().name} {exc.details() or ''}".strip(), 1)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log at INFO")] = False,
    access_key: Annotated[
        str,
        typer.Option(
            envvar="MQSTORE_ACCESS_KEY", help="account of the gateway's --acl-file: sign calls with it"
        ),
    ] = "",
    secret_key: Annotated[
        str,
        typer.Option(
            envvar="MQSTORE_SECRET_KEY",
            help="its secret (prefer the MQSTORE_SECRET_KEY variable: arguments show in ps)",
        ),
    ] = "",
    tls_ca: Annotated[
        Path | None, typer.Option(envvar="MQSTORE_TLS_CA", help="clients: CA (PEM) to verify the server")
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(envvar="MQSTORE_TLS_CERT", help="clients: client certificate (PEM)")
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(envvar="MQSTORE_TLS_KEY", help="clients: client certificate's key (PEM)")
    ] = None,
    tls_server_name: Annotated[
        str, typer.Option(envvar="MQSTORE_TLS_SERVER_NAME", help="clients: name in the server's cert")
    ] = "",
) -> None:
    """mqstore: a RocketMQ-style message store."""
    if bool(access_key) != bool(secret_key):
        raise _fail("give both --access-key and --secret-key (or MQSTORE_ACCESS_KEY and MQSTORE_SECRET_KEY)")
    if access_key:  # the clients of this process sign with them (services.credentials.Credentials.from_env)
        os.environ["MQSTORE_ACCESS_KEY"], os.environ["MQSTORE_SECRET_KEY"] = access_key, secret_key
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s"
    )
    _TLS_ARGS.update(cert=tls_cert, key=tls_key, ca=tls_ca, server_name=tls_server_name)


_TLS_ARGS: dict[str, Any] = {}  # the root's --tls-* options, for the client commands


def _client_tls() -> TlsConfig | None:
    """The client commands' TLS settings (root options / MQSTORE_TLS_*); None: plaintext."""
    try:
        return TlsConfig.load(**_TLS_ARGS)
    except ConfigError as exc:
        raise _fail(str(exc)) from None


# -- serve ----------------------------------------------------------------------------------------
@app.command()
def serve(
    role: Annotated[
        str, typer.Option(envvar="MQSTORE_ROLE", help="embedded|commitlog|dispatch|index|gateway")
    ] = "embedded",
    data: Annotated[Path, typer.Option(envvar="MQSTORE_DATA_DIR", help="data folder")] = Path("data"),
    listen: Annotated[
        str, typer.Option(envvar="MQSTORE_LISTEN", help="host:port to serve on (role default)")
    ] = "",
    commitlog: Annotated[
        str, typer.Option(envvar="MQSTORE_COMMITLOG_ADDR", help="commitlog service")
    ] = "127.0.0.1:10911",
    dispatch: Annotated[
        str, typer.Option(envvar="MQSTORE_DISPATCH_ADDR", help="dispatch service")
    ] = "127.0.0.1:10921",
    index: Annotated[
        str, typer.Option(envvar="MQSTORE_INDEX_ADDR", help="index service")
    ] = "127.0.0.1:10931",
    config: Annotated[
        Path | None, typer.Option(envvar="MQSTORE_CONFIG_FILE", help="broker.conf-style file")
    ] = None,
    flush_disk_type: Annotated[FlushDiskType | None, typer.Option(help="SYNC_FLUSH or ASYNC_FLUSH")] = None,
    broker_role: Annotated[
        BrokerRole | None,
        typer.Option(envvar="MQSTORE_BROKER_ROLE", help="ASYNC_MASTER, SYNC_MASTER or SLAVE"),
    ] = None,
    broker_name: Annotated[
        str | None, typer.Option(envvar="MQSTORE_BROKER_NAME", help="broker group (default broker-a)")
    ] = None,
    broker_id: Annotated[
        int | None, typer.Option(envvar="MQSTORE_BROKER_ID", min=0, help="0: master, 1..: slaves")
    ] = None,
    ha_master: Annotated[
        str | None, typer.Option(envvar="MQSTORE_HA_MASTER", help="SLAVE: the master's HA endpoint host:port")
    ] = None,
    ha_listen: Annotated[
        str,
        typer.Option(
            envvar="MQSTORE_HA_LISTEN", help="replication endpoint (commitlog role default: its port + 1)"
        ),
    ] = "",
    ha_peers: Annotated[
        str,
        typer.Option(
            envvar="MQSTORE_HA_PEERS",
            help="the other members' commitlog addresses, comma-separated (role discovery, fencing)",
        ),
    ] = "",
    advertise: Annotated[
        str, typer.Option(envvar="MQSTORE_ADVERTISE", help="this service's address as peers reach it")
    ] = "",
    ha_advertise: Annotated[
        str, typer.Option(envvar="MQSTORE_HA_ADVERTISE", help="the HA endpoint as slaves reach it")
    ] = "",
    tls_cert: Annotated[
        Path | None,
        typer.Option(envvar="MQSTORE_TLS_CERT", help="PEM certificate chain: every port serves TLS"),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(envvar="MQSTORE_TLS_KEY", help="PEM key of --tls-cert")
    ] = None,
    tls_ca: Annotated[
        Path | None,
        typer.Option(
            envvar="MQSTORE_TLS_CA",
            help="PEM CA: internal ports require client certs it signed; channels verify peers with it",
        ),
    ] = None,
    tls_client_ca: Annotated[
        Path | None,
        typer.Option(
            envvar="MQSTORE_TLS_CLIENT_CA",
            help="gateway: require client certificates signed by this PEM CA (not --tls-ca's)",
        ),
    ] = None,
    tls_server_name: Annotated[
        str,
        typer.Option(
            envvar="MQSTORE_TLS_SERVER_NAME", help="name expected in peers' certificates instead of the host"
        ),
    ] = "",
    health_listen: Annotated[
        str,
        typer.Option(envvar="MQSTORE_HEALTH_LISTEN", help="plaintext port serving only gRPC health (probes)"),
    ] = "",
    metrics_listen: Annotated[
        str,
        typer.Option(
            envvar="MQSTORE_METRICS_LISTEN",
            help="host:port of a Prometheus scrape endpoint (GET /metrics, plain HTTP); off when empty",
        ),
    ] = "",
    master_role: Annotated[
        BrokerRole | None,
        typer.Option(
            envvar="MQSTORE_MASTER_ROLE",
            help="commitlog in a StatefulSet: broker id 0 starts as this role, ids 1.. as SLAVE "
            "(--broker-role wins; a role saved by a switch wins over both)",
        ),
    ] = None,
    election: Annotated[
        str,
        typer.Option(
            envvar="MQSTORE_ELECTION",
            help="commitlog: 'etcd' elects the broker group's master through etcd (automatic failover; "
            "the elected role is --master-role, default ASYNC_MASTER)",
        ),
    ] = "",
    etcd: Annotated[
        str, typer.Option(envvar="MQSTORE_ETCD", help="with --election etcd: host:port[,host:port...]")
    ] = "",
    etcd_prefix: Annotated[
        str, typer.Option(envvar="MQSTORE_ETCD_PREFIX", help="with --election etcd: key prefix")
    ] = "/mqstore",
    unclean_election: Annotated[
        bool,
        typer.Option(
            envvar="MQSTORE_UNCLEAN_ELECTION",
            help="with --election etcd: when no in-sync member is alive, elect the furthest live one "
            "anyway, losing what it lacks (enableElectUncleanMaster)",
        ),
    ] = False,
    acl_file: Annotated[
        Path | None,
        typer.Option(
            envvar="MQSTORE_ACL_FILE",
            help="gateway: plain_acl.yml accounts; both client protocols (RocketMQ 5 and mqstore's "
            "own API) then require signed calls",
        ),
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="store key=value (repeatable)")] = None,
) -> None:
    """Run the embedded suite (default) or one service of the split topology until SIGTERM.

    A gateway takes comma-separated --commitlog/--dispatch/--index lists: the members of one
    broker group (master and slaves), in the same order."""
    from services.serve import ROLES, ServeOptions, serve_forever

    if role not in ROLES:
        raise _fail(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
    store = _store_settings(set_)
    if flush_disk_type is not None:
        store["flushDiskType"] = flush_disk_type.value
    if master_role is BrokerRole.SLAVE:
        raise _fail("--master-role takes ASYNC_MASTER or SYNC_MASTER")
    if election and election != "etcd":
        raise _fail(f"--election takes etcd, got {election!r}")
    if election and role != "commitlog":
        raise _fail("--election is for the commitlog role (each member of a broker group)")
    if election and not etcd:
        raise _fail("--election etcd needs --etcd host:port[,host:port...]")
    if unclean_election:
        store["enableElectUncleanMaster"] = "true"
    elected_role = master_role or (broker_role if broker_role is not BrokerRole.SLAVE else None)
    broker_role = initial_broker_role(broker_role, master_role, broker_id)
    for key, value in (
        ("brokerRole", broker_role.value if broker_role else None),
        ("brokerName", broker_name),
        ("brokerId", broker_id),
        ("haMasterAddress", ha_master),
    ):
        if value is not None:
            store[key] = str(value)
    for text, what in ((ha_master, "--ha-master"), (advertise, "--advertise")):
        if text and not _is_host_port(text):
            raise _fail(f"{what} takes host:port, got {text!r}")
    # Where this process listens, port 0 lets the kernel pick one (the log says which).
    for text, what in (
        (ha_listen, "--ha-listen"),
        (health_listen, "--health-listen"),
        (metrics_listen, "--metrics-listen"),
    ):
        if text and not _is_host_port(text, any_port=True):
            raise _fail(f"{what} takes host:port, got {text!r}")
    peers = tuple(p.strip() for p in ha_peers.split(",") if p.strip())
    bad = [p for p in peers if not _is_host_port(p)]
    if bad:
        raise _fail(f"--ha-peers takes host:port,host:port..., got {bad[0]!r}")
    if peers or election:
        # Peers and the election are told this member's addresses before anything binds.
        for text, advertised, flag in (
            (listen, advertise, "--listen"),
            (ha_listen or listen, ha_advertise, "--ha-listen"),  # unset: --listen's port + 1, or 0
        ):
            if text.endswith(":0") and not advertised:
                real = flag.replace("listen", "advertise")
                raise _fail(
                    f"{flag} {text}: with --ha-peers or --election this member's address is handed to "
                    f"its peers, so it needs a port (or {real} with the real one)"
                )
    try:
        tls = TlsConfig.load(
            tls_cert or _TLS_ARGS.get("cert"),
            tls_key or _TLS_ARGS.get("key"),
            tls_ca or _TLS_ARGS.get("ca"),
            client_ca=tls_client_ca,
            server_name=tls_server_name,
            server=True,
        )
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    options = ServeOptions(
        role=role,
        data_dir=data,
        listen=listen,
        commitlog=commitlog,
        dispatch=dispatch,
        index=index,
        store=store,
        conf_file=config,
        env=dict(os.environ),
        ha_listen=ha_listen,
        ha_peers=peers,
        advertise=advertise,
        tls=tls,
        health_listen=health_listen,
        metrics_listen=metrics_listen,
        ha_advertise=ha_advertise,
        acl_file=acl_file,
        election=election,
        etcd=etcd,
        etcd_prefix=etcd_prefix,
        master_role=elected_role,
    )
    if role != "commitlog" and not listen and role in ("embedded", "gateway"):
        err_console.print(f"mqstore {role}: gateway on {options.address}, data in {data.resolve()}")
    with _Errors(options.address):
        try:
            event_loop.run(serve_forever(options))
        except OSError as exc:
            raise _fail(f"cannot serve on {options.address}: {exc}", 1) from None


def initial_broker_role(
    broker_role: BrokerRole | None, master_role: BrokerRole | None, broker_id: int | None
) -> BrokerRole | None:
    """The role a commitlog starts with: --broker-role when given; else, with --master-role (one
    pod template for every member of a StatefulSet), that role for broker id 0 and SLAVE for the
    others; else None (the store's brokerRole setting). A role saved by a switch wins at start."""
    if broker_role is not None or master_role is None:
        return broker_role
    return master_role if not broker_id else BrokerRole.SLAVE


# -- produce --------------------------------------------------------------------------------------
def _payloads(file: Path | None, stdin: bool, count: int, size: int) -> tuple[Iterator[bytes], int | None]:
    if file is not None:
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise _fail(f"cannot read {file}: {exc.strerror}") from None
        return iter([data]), 1
    if stdin:
        return (line.rstrip(b"\n") for line in sys.stdin.buffer), None
    pool = os.urandom(max(size * 4, 1 << 16))

    def generated() -> Iterator[bytes]:
        for i in range(count):
            start = (i * 4099) % (len(pool) - size) if len(pool) > size else 0
            yield pool[start : start + size]

    return generated(), count


@app.command()
def produce(
    topic: Annotated[str, typer.Option(help="topic to send to")],
    count: Annotated[int, typer.Option(min=1, help="generated messages")] = 1000,
    size: Annotated[int, typer.Option(min=1, max=4 * 1024 * 1024, help="generated body size (bytes)")] = 1024,
    file: Annotated[Path | None, typer.Option(help="send this file as one message")] = None,
    stdin: Annotated[bool, typer.Option(help="send each stdin line as a message")] = False,
    tags: Annotated[str | None, typer.Option(help="TAGS of every message")] = None,
    key_prefix: Annotated[str | None, typer.Option(help="KEYS: <prefix>-<n> per message")] = None,
    batch: Annotated[int, typer.Option(min=1, max=1024, help="messages per Produce call")] = 256,
    inflight: Annotated[int, typer.Option(min=1, max=64, help="batches in flight")] = 4,
    address: AddressOpt = DEFAULT_GATEWAY,
) -> None:
    """Send messages; prints throughput and the ids of the first and last."""
    from services.client import OutgoingMessage, Producer

    payloads, total = _payloads(file, stdin, count, size)
    sent = 0
    first_id = last_id = ""
    failed = 0
    t0 = time.perf_counter()
    with _Errors(address), Producer(address, tls=_client_tls()) as producer, _progress(total) as (bar, task):
        pending = []

        def settle(fut) -> None:
            nonlocal failed, first_id, last_id
            results = fut.result()
            if results.appended:
                first_id = first_id or results[0].msg_id
                last_id = results[results.appended - 1].msg_id
            ok = results.appended
            if results.status.name != "PUT_OK":  # only the messages that did not wait (WAIT=false)
                ok = sum(1 for i in results.unwaited if i < results.appended)
            failed += len(results) - ok
            bar.advance(task, len(results))

        chunk: list[OutgoingMessage] = []
        for n, body in enumerate(payloads):
            keys = [f"{key_prefix}-{n}"] if key_prefix else []
            chunk.append(OutgoingMessage(topic, body, tags, keys))
            if len(chunk) >= batch:
                pending.append(producer.send_batch_async(chunk))
                sent += len(chunk)
                chunk = []
                while len(pending) >= inflight:
                    settle(pending.pop(0))
        if chunk:
            pending.append(producer.send_batch_async(chunk))
            sent += len(chunk)
        for fut in pending:
            settle(fut)
    seconds = time.perf_counter() - t0
    console.print(
        f"sent {sent:,} messages to {topic} in {seconds:.2f} s: {sent / seconds:,.0f} msgs/s"
        + (f", {failed:,} not stored durably" if failed else "")
    )
    if first_id:
        console.print(f"first msg id {first_id}, last msg id {last_id}")
    if failed:
        raise typer.Exit(1)


class _progress:
    def __init__(self, total: int | None) -> None:
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err_console,
        )
        self.total = total

    def __enter__(self):
        self.bar.__enter__()
        return self.bar, self.bar.add_task("messages", total=self.total)

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)  # type: ignore[arg-type]


# -- consume --------------------------------------------------------------------------------------
@app.command()
def consume(
    group: Annotated[str, typer.Option(help="consumer group")],
    topic: Annotated[str, typer.Option(help="topic")],
    tags: Annotated[str, typer.Option(help='tag expression: "*" or "a || b"')] = "*",
    max_messages: Annotated[int, typer.Option("--max", min=0, help="stop after this many (0: no limit)")] = 0,
    idle_exit_ms: Annotated[
        int, typer.Option(min=0, help="stop after this long without messages (0: never)")
    ] = 3000,
    output: Annotated[Path | None, typer.Option(help="write bodies here, one JSON line per message")] = None,
    quiet: Annotated[bool, typer.Option(help="do not print messages")] = False,
    address: AddressOpt = DEFAULT_GATEWAY,
) -> None:
    """Consume as a group from its committed offsets, committing as it goes."""
    from services.client import PullConsumer, tune_allocator

    tune_allocator()  # this process decodes pulls of megabytes: keep freed heap (client module doc)
    received = 0
    out = output.open("w", encoding="utf-8") if output else None
    t0 = time.perf_counter()
    last = time.monotonic()
    try:
        with (
            _Errors(address),
            PullConsumer(address, group, topic, tag_expression=tags, tls=_client_tls()) as consumer,
        ):
            while True:
                batch = consumer.poll(timeout_ms=500)
                for rec in batch:
                    line = {
                        "queue_id": rec.queue_id,
                        "queue_offset": rec.queue_offset,
                        "msg_id": rec.msg_id,
                        "tags": rec.tags,
                        "keys": rec.keys,
                        "body": rec.body.decode("utf-8", "replace"),
                    }
                    if out is not None:
                        out.write(json.dumps(line) + "\n")
                    elif not quiet:
                        console.print(json.dumps(line), markup=False, highlight=False)
                received += len(batch)
                if batch:
                    last = time.monotonic()
                    consumer.commit()
                if max_messages and received >= max_messages:
                    break
                if idle_exit_ms and (time.monotonic() - last) * 1000 >= idle_exit_ms:
                    break
            consumer.commit()
    finally:
        if out is not None:
            out.close()
    seconds = time.perf_counter() - t0
    err_console.print(f"received {received:,} messages in {seconds:.2f} s")


# -- query ----------------------------------------------------------------------------------------
@app.command()
def query(
    topic: Annotated[str, typer.Option(help="topic (for --key and --time)")] = "",
    key: Annotated[str | None, typer.Option(help="KEYS entry or UNIQ_KEY")] = None,
    msg_id: Annotated[str | None, typer.Option("--id", help="offset message id")] = None,
    at: Annotated[
        int | None, typer.Option("--time", help="ms since the epoch: first message per queue")
    ] = None,
    address: AddressOpt = DEFAULT_GATEWAY,
) -> None:
    """Find messages by key, by message id or by store time."""
    from services.client import Admin

    if sum(x is not None for x in (key, msg_id, at)) != 1:
        raise _fail("give exactly one of --key, --id, --time")
    if (key is not None or at is not None) and not topic:
        raise _fail("--topic is required with --key and --time")
    with _Errors(address), Admin(address, tls=_client_tls()) as admin:
        if key is not None:
            views = admin.query_by_key(topic, key)
        elif msg_id is not None:
            views = [admin.query_by_id(msg_id)]
        else:
            views = admin.query_by_time(topic, at or 0)
    table = Table("msg id", "topic", "queue", "offset", "tags", "keys", "stored", "body")
    for v in views:
        stored = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.store_timestamp / 1000))
        body = v.body[:40].decode("utf-8", "replace")
        table.add_row(
            v.msg_id, v.topic, str(v.queue_id), str(v.queue_offset), v.tags, " ".join(v.keys), stored, body
        )
    console.print(table)
    if not views:
        raise typer.Exit(1)


# -- admin ----------------------------------------------------------------------------------------
RetentionOpt = Annotated[
    float | None,
    typer.Option(
        "--retention-hours",
        min=0.0,
        help="expire the topic's messages older than this (0: the store's fileReservedTime)",
    ),
]


DurabilityOpt = Annotated[
    str | None,
    typer.Option(
        "--durability",
        help="persistent, or transient: the topic's messages are held in memory only (never flushed "
        "or replicated) and are gone after a restart or failover",
    ),
]


def _describe(t: TopicConfig) -> str:
    retention = f"retention {t.retention_hours:g} h" if t.retention_hours else "store retention"
    kind = t.message_type.value
    return (
        f"topic {t.topic_name}: {t.write_queue_nums} queues, perm {t.perm}, {kind}, {retention}, "
        f"{t.durability.value}"
    )


@topic_app.command("create")
def topic_create(
    topic: Annotated[str, typer.Argument(help="topic name")],
    queues: Annotated[int, typer.Option(min=1, max=1024, help="read and write queues")] = 8,
    message_type: Annotated[str, typer.Option(help="NORMAL, FIFO, DELAY, TRANSACTION")] = "NORMAL",
    retention_hours: RetentionOpt = None,
    durability: DurabilityOpt = None,
    address: AddressOpt = DEFAULT_GATEWAY,
) -> None:
    """Create or update a topic."""
    from services.client import Admin

    with _Errors(address), Admin(address, tls=_client_tls()) as admin:
        t = admin.create_topic(
            topic,
            queues,
            message_type=message_type,
            retention_hours=retention_hours or 0.0,
            durability=durability or "persistent",
        )
    console.print(_describe(t))


@topic_app.command("update")
def topic_update(
    topic: Annotated[str, typer.Argument(help="topic name")],
    queues: Annotated[int | None, typer.Option(min=1, max=1024, help="read and write queues")] = None,
    message_type: Annotated[str | None, typer.Option(help="NORMAL, FIFO, DELAY, TRANSACTION")] = None,
    retention_hours: RetentionOpt = None,
    durability: DurabilityOpt = None,
    address: AddressOpt = DEFAULT_GATEWAY,
) -> None:
    """Change an existing topic: only the options given."""
    from services.client import Admin

    with _Errors(address), Admin(address, tls=_client_tls()) as admin:
        current = next((t for t in admin.list_topics() if t.topic_name == topic), None)
        if current is None:
            console.print(f"[red]topic {topic!r} does not exist[/red]")
            raise typer.Exit(1)
        t = admin.create_topic(
            topic,
            queues or current.write_queue_nums,
            perm=current.perm,
            message_type=message_type or current.message_type.value,
            retention_hours=current.retention_hours if retention_hours is None else retention_hours,
            durability=durability or current.durability.value,
        )
    console.print(_describe(t))


@topic_app.command("delete")
def topic_delete(
    topic: Annotated[str, typer.Argument(help="topic name")],
    address: AddressOpt = DEFAULT_GATEWAY,
) -> None:
    """Delete a topic; its stored messages expire at once."""
    from services.client import Admin

    with _Errors(address), Admin(address, tls=_client_tls()) as admin:
        deleted = admin.delete_topic(topic)
    if not deleted:
        console.print(f"[red]topic {topic!r} does not exist[/red]")
        raise typer.Exit(1)
    console.print(f"topic {topic} deleted")


@group_app.command("create")
def group_create(
    group: Annotated[str, typer.Argument(help="consumer group name")],
    retry_max_times: Annotated[
        int, typer.Option(min=0, max=1000, help="redeliveries before the message goes to %DLQ%<group>")
    ] = 16,
    fifo: Annotated[
        bool, typer.Option(help="consume orderly: one message group's messages in order")
    ] = False,
    start: Annotated[
        str,
        typer.Option(
            "--from",
            help="where the group starts in a queue it has no offset for: latest (RocketMQ's default: "
            "the last message, or the start of a young queue) or earliest (the whole history)",
        ),
    ] = "latest",
    address: AddressOpt = DEFAULT_GATEWAY,
) -> None:
    """Create or update a consumer group (RocketMQ 5 clients: retries, FIFO, where it starts)."""
    from services.client import Admin

    with _Errors(address), Admin(address, tls=_client_tls()) as admin:
        g = admin.upsert_group(group, retry_max_times=retry_max_times, orderly=fifo, consume_from=start)
    kind = "FIFO" if g.consume_message_orderly else "concurrent"
    console.print(
        f"group {g.group_name}: {kind}, retry max times {g.retry_max_times}, starts at the {g.consume_from}"
    )


@topic_app.command("list")
def topic_list(address: AddressOpt = DEFAULT_GATEWAY) -> None:
    """List topics."""
    from services.client import Admin

    with _Errors(address), Admin(address, tls=_client_tls()) as admin:
        topics = admin.list_topics()
    table = Table("topic", "read queues", "write queues", "perm", "type", "retention", "durability")
    for t in topics:
        table.add_row(
            t.topic_name,
            str(t.read_queue_nums),
            str(t.write_queue_nums),
            str(t.perm),
            t.message_type.value,
            f"{t.retention_hours:g} h" if t.retention_hours else "store",
            t.durability.value,
        )
    console.print(table)


@app.command()
def progress(
    group: Annotated[str, typer.Option(help="consumer group")],
    topic: Annotated[str, typer.Option(help="topic")],
    address: AddressOpt = DEFAULT_GATEWAY,
) -> None:
    """Committed offset and lag per queue of a consumer group."""
    from services.client import Admin

    with _Errors(address), Admin(address, tls=_client_tls()) as admin:
        p = admin.consumer_progress(group, topic)
    title = f"{group} on {topic}: lag {p.total_lag:,}"
    if p.total_expired:
        title += f", {p.total_expired:,} expired before they were consumed"
    table = Table("queue", "committed", "min", "max", "lag", "expired", title=title)
    for q in p.queues:
        table.add_row(
            str(q.queue_id),
            str(q.committed_offset),
            str(q.min_offset),
            str(q.max_offset),
            f"{q.lag:,}",
            f"{q.expired:,}",
        )
    console.print(table)


def _ago(ms: int) -> str:
    """``ms`` (since the epoch) as "N s ago (local time)"."""
    seconds = max(0.0, time.time() - ms / 1000.0)
    return f"{seconds:,.0f} s ago ({time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ms / 1000.0))})"


@app.command()
def stats(address: AddressOpt = DEFAULT_GATEWAY) -> None:
    """Store statistics: log offsets, dispatch progress, disk and retention."""
    from services.client import Admin

    with _Errors(address), Admin(address, tls=_client_tls()) as admin:
        s = admin.store_stats()
    table = Table("stat", "value")
    for name, value in (
        ("CommitLog min offset", s.commit_log_min_offset),
        ("CommitLog max offset", s.commit_log_max_offset),
        ("confirm offset", s.confirm_offset),
        ("flushed offset", s.flushed_offset),
        ("dispatch offset", s.dispatch_offset),
        ("index offset", s.index_offset),
        ("topics", s.topics),
        ("flush disk type", s.flush_disk_type),
        ("broker role", s.broker_role),
        ("disk free", f"{s.disk_free_bytes / 2**30:,.1f} GiB of {s.disk_total_bytes / 2**30:,.1f} GiB"),
        ("disk used (as df)", f"{s.disk_used_ratio:.1%}"),
        ("puts refused", s.disk_full or "no"),
        (
            "last cleanup",
            f"{_ago(s.last_cleanup_ms)}; {s.cleanup_deleted_files:,} segments, "
            f"{s.cleanup_deleted_bytes:,} bytes deleted since start"
            if s.last_cleanup_ms
            else "not yet (the first round runs a minute after start)",
        ),
        (
            "quarantined by recovery",
            f"{s.quarantined_files:,} files, {s.quarantined_bytes:,} bytes in {s.quarantine_dir}"
            if s.quarantined_files
            else "nothing",
        ),
    ):
        table.add_row(name, f"{value:,}" if isinstance(value, int) else str(value))
    console.print(table)
    if s.quarantined_files:
        console.print(
            f"[yellow]recovery cut log bytes it could not read as records and moved them to "
            f"{s.quarantine_dir}: look at them, then delete them[/yellow]"
        )


# -- ha -------------------------------------------------------------------------------------------
CommitLogOpt = Annotated[
    str,
    typer.Option("--commitlog", "-c", envvar="MQSTORE_COMMITLOG_ADDR", help="commitlog service host:port"),
]


def _ha_call(address: str, method: str, *args: object):
    from services._common.mux import close_channel
    from services._common.remote import open_channel
    from services.commitlog.client import RemoteCommitLog

    async def run():
        channel = open_channel(address, _client_tls())
        try:
            return await getattr(RemoteCommitLog(channel, timeout_s=15.0), method)(*args)
        finally:
            await close_channel(channel)

    with _Errors(address):
        return asyncio.run(run())


def _print_ha(state) -> None:
    table = Table("field", "value", title=f"{state.broker_name} id {state.broker_id}: {state.broker_role}")
    rows = [
        ("epoch", state.epoch),
        ("epochs", " ".join(f"{e.epoch}@{e.start_offset}" for e in state.epochs) or "-"),
        ("commitlog address", state.commitlog_address),
        ("HA endpoint", state.ha_address or "-"),
        ("max offset", state.max_offset),
        ("confirm offset", state.confirm_offset),
    ]
    if state.broker_role == "SLAVE":
        rows += [
            ("master", state.master_address),
            ("connected", "yes" if state.master_connected else "no"),
            ("master max offset", state.master_max_offset),
            ("behind (bytes)", state.lag_bytes),
        ]
    else:
        rows += [("replicated offset", state.replicated_offset), ("in-sync replicas", state.in_sync_replicas)]
    for name, value in rows:
        table.add_row(name, f"{value:,}" if isinstance(value, int) else str(value))
    console.print(table)
    if state.slaves:
        slaves = Table("slave", "id", "acked offset", "behind (bytes)", "behind (ms)", "in sync")
        for sl in state.slaves:
            slaves.add_row(
                sl.address,
                str(sl.broker_id),
                f"{sl.ack_offset:,}",
                f"{sl.lag_bytes:,}",
                f"{sl.lag_ms:,}",
                "yes" if sl.in_sync else "no",
            )
        console.print(slaves)


@ha_app.command("state")
def ha_state(commitlog: CommitLogOpt = "127.0.0.1:10911") -> None:
    """Role, epochs, offsets and (on a master) each slave's acknowledged offset and lag."""
    _print_ha(_ha_call(commitlog, "ha_state"))


@ha_app.command("promote")
def ha_promote(
    commitlog: CommitLogOpt = "127.0.0.1:10911",
    role: Annotated[
        str, typer.Option("--role", help="ASYNC_MASTER or SYNC_MASTER (default: the old master's)")
    ] = "",
    force: Annotated[bool, typer.Option(help="even while the old master still answers")] = False,
) -> None:
    """Make a SLAVE the master of its broker group, in a new epoch."""
    if role and role.upper() not in ("ASYNC_MASTER", "SYNC_MASTER"):
        raise _fail(f"--role takes ASYNC_MASTER or SYNC_MASTER, got {role!r}")
    _print_ha(_ha_call(commitlog, "promote", role.upper(), force))


@ha_app.command("demote")
def ha_demote(
    master: Annotated[str, typer.Option("--master", help="the new master's HA endpoint host:port")],
    commitlog: CommitLogOpt = "127.0.0.1:10911",
) -> None:
    """Make a master the SLAVE of another master (it cuts what that master never had)."""
    if not _is_host_port(master):
        raise _fail(f"--master takes host:port, got {master!r}")
    _print_ha(_ha_call(commitlog, "demote", master, 0))


def _is_host_port(text: str, *, any_port: bool = False) -> bool:
    """``host:port`` with a port of 1-65535 (0 too with ``any_port``: an address to listen on)."""
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and (0 if any_port else 1) <= int(port) < 65536)


# -- demo -----------------------------------------------------------------------------------------
@app.command()
def demo(
    data: Annotated[Path | None, typer.Option(help="store folder (default ./data/demo; wiped first)")] = None,
    messages: Annotated[int, typer.Option(min=1, help="messages to append")] = 100_000,
    queues: Annotated[int, typer.Option(min=1, max=1024, help="queues of the demo topic")] = 16,
    size: Annotated[int, typer.Option(min=1, max=4 * 1024 * 1024, help="body size in bytes")] = 1024,
    batch: Annotated[int, typer.Option(min=1, max=4096, help="messages per put")] = 256,
    flush: Annotated[FlushDiskType, typer.Option(help="flush disk type")] = FlushDiskType.ASYNC_FLUSH,
) -> None:
    """libstore alone: append generated messages, reopen (recovery), read everything back."""
    from services.demo import default_data_dir, run_demo

    folder = data or default_data_dir()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        tasks = {
            "append": bar.add_task("append", total=messages),
            "read": bar.add_task("read back", total=messages),
        }
        try:
            report = run_demo(
                folder,
                messages=messages,
                queues=queues,
                body_size=size,
                batch=batch,
                flush_disk_type=flush,
                progress=lambda phase, n: bar.advance(tasks[phase], n),
            )
        except StoreError as exc:
            raise _fail(str(exc)) from None
        bar.update(tasks["read"], completed=report.verified)
    table = Table(
        title=f"libstore demo: {report.messages:,} messages x {size} B, {queues} queues, {flush.value}"
    )
    table.add_column("phase")
    table.add_column("result", justify="right")
    mb = report.bytes_appended / 1e6
    table.add_row("append", f"{report.append_rate:,.0f} msgs/s, {mb / report.append_seconds:,.1f} MB/s")
    table.add_row(
        "recovery (reopen)",
        f"{report.recovery_seconds * 1000:,.0f} ms, "
        f"{report.recovery_files_scanned} of {report.segments} segments read",
    )
    table.add_row("read back + verify", f"{report.read_rate:,.0f} msgs/s ({report.verified:,} identical)")
    console.print(table)
    console.print(f"store folder: {folder}")


# -- spark ----------------------------------------------------------------------------------------
MasterOpt = Annotated[str, typer.Option(help="Spark master: local[*] (default) or a cluster URL")]
ProgressOpt = Annotated[bool, typer.Option(help="show the running stages' progress")]


def _store_settings(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise _fail(f"--set takes key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _commitlog_folder(path: Path) -> Path:
    if not path.is_dir():
        raise _fail(f"{path} is not a folder")
    if not any(p.name.isdigit() for p in path.iterdir()):
        raise _fail(f"{path} holds no CommitLog file (files named by their 20-digit offset)")
    return path.resolve()


def _spark(master: str) -> object:
    try:
        from services.spark.session import spark_session

        return spark_session(master)
    except ImportError as exc:
        raise _fail(f"Spark jobs need pyspark and pyarrow ({exc}); run `make install`", 1) from None
    except Exception as exc:  # the JVM did not start: no Java, unresolvable host, bad master
        raise _fail(f"cannot start Spark on {master}: {str(exc).splitlines()[0]}", 1) from None


@spark_app.command("verify")
def spark_verify(
    commitlog: Annotated[Path, typer.Argument(help="the CommitLog folder (<store>/commitlog)")],
    master: MasterOpt = "local[*]",
    show_progress: ProgressOpt = True,
) -> None:
    """Check every record of every CommitLog file: CRC, structure, offsets. Exit 1 on damage."""
    from services.spark import jobs
    from services.spark.session import stage_progress

    folder = _commitlog_folder(commitlog)
    spark = _spark(master)
    with stage_progress(spark, "verify", show_progress):
        report = jobs.verify(spark, folder)
    table = Table("file", "records", "bytes", "CRC failures", "unreadable", "first offset", "end offset")
    for f in report.files:
        table.add_row(
            f.file + ("" if f.starts_at_base else " (first record not at the file's offset)"),
            f"{f.records:,}",
            f"{f.bytes:,}",
            str(f.crc_failures),
            str(f.unreadable),
            "" if f.first_offset is None else str(f.first_offset),
            "" if f.end_offset is None else str(f.end_offset),
        )
    console.print(table)
    verdict = "OK" if report.ok else "DAMAGED"
    console.print(
        f"{verdict}: {report.records:,} records in {len(report.files)} files, "
        f"{report.crc_failures} CRC failures, {report.unreadable} unreadable"
    )
    if not report.ok:
        raise typer.Exit(1)


@spark_app.command("rebuild")
def spark_rebuild(
    commitlog: Annotated[Path, typer.Argument(help="the CommitLog folder (<store>/commitlog)")],
    out: Annotated[Path, typer.Option(help="folder to write consumequeue/ and index/ into")],
    master: MasterOpt = "local[*]",
    show_progress: ProgressOpt = True,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="store key=value (the store's mappedFileSizeConsumeQueue, maxHashSlotNum, ...)"
        ),
    ] = None,
) -> None:
    """Build ConsumeQueues and IndexFiles from a CommitLog, as dispatch builds them."""
    from services.spark import jobs
    from services.spark.session import stage_progress

    folder = _commitlog_folder(commitlog)
    try:
        config = StoreConfig.from_mapping(_store_settings(set_))
    except (ConfigError, ValueError) as exc:
        raise _fail(str(exc)) from None
    spark = _spark(master)
    with stage_progress(spark, "rebuild", show_progress):
        try:
            report = jobs.rebuild(spark, folder, out, config)
        except FileExistsError as exc:
            raise _fail(str(exc)) from None
    console.print(
        f"rebuilt {report.queues} ConsumeQueues and {report.index_files} IndexFiles from "
        f"{report.records:,} records (log end {report.log_end}) into {out}"
    )


@spark_app.command("stats")
def spark_stats(
    commitlog: Annotated[Path, typer.Argument(help="the CommitLog folder (<store>/commitlog)")],
    master: MasterOpt = "local[*]",
    show_progress: ProgressOpt = True,
    csv: Annotated[Path | None, typer.Option(help="also write the table as CSV here")] = None,
) -> None:
    """Messages and bytes per topic per hour of store time (UTC)."""
    from services.spark import jobs
    from services.spark.session import stage_progress

    folder = _commitlog_folder(commitlog)
    spark = _spark(master)
    with stage_progress(spark, "stats", show_progress):
        rows = jobs.stats(spark, folder)
    table = Table("hour (UTC)", "topic", "messages", "bytes")
    for r in rows:
        table.add_row(
            r["hour"].strftime("%Y-%m-%d %H:00"), r["topic"], f"{r['messages']:,}", f"{r['bytes']:,}"
        )
    console.print(table)
    if csv is not None:
        import csv as csv_mod

        with csv.open("w", newline="") as fh:
            w = csv_mod.writer(fh)
            w.writerow(["hour", "topic", "messages", "bytes"])
            for r in rows:
                w.writerow([r["hour"].isoformat(), r["topic"], r["messages"], r["bytes"]])


def main() -> None:
    app()


if __name__ == "__main__":
    main()
