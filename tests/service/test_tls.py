"""TLS and mutual TLS on real services (127.0.0.1, certificates made by tests/tls_certs.py):
the split topology over mutual TLS; internal RPCs (Append, Demote, Replicate) refused, with
nothing changed, to peers without a certificate of the CA; a TLS gateway refusing plaintext
clients; the CLI's TLS options and its one-line errors for bad TLS files."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from libstore import AuthenticationError, ConfigError, PermissionDeniedError, ServiceNotAvailableError
from services._common.tls import TlsConfig
from services.client import Admin, Producer, PullConsumer
from services.credentials import Credentials
from services.proto import commitlog_grpc, commitlog_pb, common_pb, ha_grpc, ha_pb
from services.serve import ServeOptions, Suite
from tests.service.harness import (
    SMALL_STORE,
    InProcessSuites,
    SplitCluster,
    free_port,
    poll_until,
    refusing_address,
    wait_until,
)
from tests.service.test_cli import mqstore
from tests.tls_certs import APP_CN, Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _channel(address: str, tls: TlsConfig | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, tls.channel_credentials(), options=tls.channel_options())


def _assert_refused(address: str, tls: TlsConfig | None) -> None:
    """A health check from a peer with ``tls`` fails at the handshake (UNAVAILABLE)."""
    with _channel(address, tls) as channel:
        with pytest.raises(grpc.RpcError) as info:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def _files(root: Path) -> dict[str, bytes]:
    """The bytes of the CommitLog files and of config/haState.json under a commitlog's root.
    Left out: what the background allocator is making or has made ahead of the log (a
    ``.tmp`` file it renames when done, a segment of zeros holding no record yet), which comes
    and goes whatever the calls do."""
    out: dict[str, bytes] = {}
    for p in sorted((root / "commitlog").iterdir()):
        if p.name.endswith(".tmp"):
            continue
        data = p.read_bytes()
        if data.strip(b"\0"):
            out[str(p.relative_to(root))] = data
    out["haState.json"] = (root / "config" / "haState.json").read_bytes()
    return out


# -- (a) the split topology over mutual TLS ------------------------------------------------------
@pytest.fixture
def tls_split(tmp_path: Path, pki: Pki) -> Iterator[SplitCluster]:
    cluster = SplitCluster(tmp_path / "split", common_args=pki.serve_args(), tls=pki.client())
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.stop_all()


def test_split_topology_over_mutual_tls(tls_split: SplitCluster, pki: Pki) -> None:
    gateway = tls_split.gateway
    tls = pki.client(cert=False)  # the gateway does not ask clients for certificates by default
    with Admin(gateway, tls=tls) as admin:
        admin.create_topic("Secure", 2)
    with Producer(gateway, tls=tls) as producer:
        results = [producer.send("Secure", f"m{i}".encode(), keys=[f"k{i}"]) for i in range(20)]
    assert all(r.all_ok for r in results)
    with PullConsumer(gateway, "g", "Secure", tls=tls) as consumer:
        got = poll_until(consumer, 20, timeout_s=30)
    assert sorted(r.body for r in got) == sorted(f"m{i}".encode() for i in range(20))
    with Admin(gateway, tls=tls) as admin:  # the index service, reached over mutual TLS
        assert [v.body for v in admin.query_by_key("Secure", "k7")] == [b"m7"]
    # Every internal port refuses a plaintext peer, one without a client certificate and one
    # with another CA's; and nothing of this topology speaks plaintext.
    for role in ("commitlog", "dispatch", "index"):
        for refused in (None, pki.client(cert=False), pki.stranger()):
            _assert_refused(tls_split.address(role), refused)
    _assert_refused(gateway, None)


# -- (b) internal RPCs refused without a certificate of the CA -----------------------------------
def _commitlog_options(
    root: Path, tls: TlsConfig | None, *, port: int = 0, ha_port: int = 0, **store: object
) -> ServeOptions:
    """A commitlog role's options; its ports the kernel's pick unless given (a peer must know
    the address before the process starts)."""
    return ServeOptions(
        role="commitlog",
        data_dir=root,
        listen=f"127.0.0.1:{port}",
        ha_listen=f"127.0.0.1:{ha_port}",
        store={**SMALL_STORE, "autoCreateTopicEnable": "true", **store},  # topics are not the point here
        tls=tls,
    )


def test_commitlog_refuses_demote_and_append_from_peers_without_a_ca_certificate(
    suites: InProcessSuites, tmp_path: Path, pki: Pki
) -> None:
    root = tmp_path / "cl"
    suite = suites.start(_commitlog_options(root, pki.server()))
    address = suite.address
    append = commitlog_pb.AppendRequest(messages=[common_pb.Message(topic="T", queue_id=0, body=b"x" * 100)])
    with _channel(address, pki.client()) as channel:
        stub = commitlog_grpc.CommitLogServiceStub(channel)
        stub.Append(append, timeout=10)
        before_state = stub.GetHAState(commitlog_pb.GetHAStateRequest(), timeout=5)
    assert before_state.broker_role == "ASYNC_MASTER" and before_state.max_offset > 0
    before = _files(root)
    with refusing_address() as fake_master:  # were a demotion let through, it would follow nobody
        for refused in (None, pki.client(cert=False), pki.stranger()):
            with _channel(address, refused) as channel:
                stub = commitlog_grpc.CommitLogServiceStub(channel)
                for call, request in (
                    (stub.Demote, commitlog_pb.DemoteRequest(master_address=fake_master, min_epoch=0)),
                    (stub.Append, append),
                    (stub.DeleteTopic, commitlog_pb.DeleteTopicRequest(topic="T")),
                    (stub.ReleaseTransient, commitlog_pb.ReleaseTransientRequest(below=1 << 40)),
                ):
                    with pytest.raises(grpc.RpcError) as info:
                        call(request, timeout=5)
                    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    time.sleep(0.5)
    assert _files(root) == before, "a refused call changed the log or haState.json"
    with _channel(address, pki.client()) as channel:
        after = commitlog_grpc.CommitLogServiceStub(channel).GetHAState(commitlog_pb.GetHAStateRequest())
    assert (after.broker_role, after.max_offset, after.epoch) == (
        "ASYNC_MASTER",
        before_state.max_offset,
        before_state.epoch,
    )
    assert not after.master_address


# -- (c) the HA port takes only slaves with a certificate of the CA ------------------------------
def test_ha_port_refuses_slaves_without_a_ca_certificate(
    suites: InProcessSuites, tmp_path: Path, pki: Pki
) -> None:
    master = suites.start(_commitlog_options(tmp_path / "master", pki.server()))
    assert master.ha_server is not None
    ha_address = master.ha_server.address
    with _channel(master.address, pki.client()) as channel:
        stub = commitlog_grpc.CommitLogServiceStub(channel)
        for i in range(10):
            stub.Append(
                commitlog_pb.AppendRequest(
                    messages=[common_pb.Message(topic="T", queue_id=0, body=b"%d" % i)]
                )
            )
    assert master.commit_log is not None and master.ha is not None
    end = master.commit_log.max_offset

    # A raw Replicate stream without a client certificate does not get past the handshake.
    with _channel(ha_address, pki.client(cert=False)) as channel:
        hello = ha_pb.SlaveReport(hello=ha_pb.SlaveHello(broker_name="broker-a", broker_id=7))
        with pytest.raises(grpc.RpcError) as info:
            next(ha_grpc.HAServiceStub(channel).Replicate(iter([hello]), timeout=5))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]

    # A slave with a certificate of another CA (but trusting the master) never joins.
    slave_store = {"brokerRole": "SLAVE", "brokerId": 1, "haMasterAddress": ha_address}
    stranger = TlsConfig.load(pki.other_cert, pki.other_key, pki.ca)
    bad = suites.start(_commitlog_options(tmp_path / "stranger", stranger, **slave_store))
    assert bad.commit_log is not None
    time.sleep(2.0)
    assert bad.commit_log.max_offset == 0
    assert not master.ha.state().slaves
    suites.stop(bad)

    # The same slave with the CA's certificate replicates the whole log.
    good = suites.start(_commitlog_options(tmp_path / "slave", pki.server(), **slave_store))
    assert good.commit_log is not None
    wait_until(lambda: good.commit_log.max_offset >= end, "the slave to replicate the log")
    assert good.commit_log.max_offset == end
    assert [s.broker_id for s in master.ha.state().slaves] == [1]


def test_slave_finds_its_master_through_peers_over_mutual_tls(
    suites: InProcessSuites, tmp_path: Path, pki: Pki
) -> None:
    """The HA controller's peer calls (role discovery, fencing) use the process's certificate: a
    SLAVE given only --ha-peers finds its master by asking it over mutual TLS, then follows it."""
    # Each names the other before either starts: ports reserved up front, not the kernel's pick.
    master_options = _commitlog_options(tmp_path / "a", pki.server(), port=free_port(), ha_port=free_port())
    slave_options = _commitlog_options(
        tmp_path / "b", pki.server(), port=free_port(), ha_port=free_port(), brokerRole="SLAVE", brokerId=1
    )
    master_options.ha_peers = (slave_options.address,)
    slave_options.ha_peers = (master_options.address,)
    master = suites.start(master_options)
    with _channel(master.address, pki.client()) as channel:
        commitlog_grpc.CommitLogServiceStub(channel).Append(
            commitlog_pb.AppendRequest(messages=[common_pb.Message(topic="T", queue_id=0, body=b"peer")])
        )
    assert master.commit_log is not None
    slave = suites.start(slave_options)  # raises ConfigError when no peer answers as the master
    assert slave.ha is not None and slave.commit_log is not None
    assert slave.ha.state().master_address == master_options.ha_address
    master_end = master.commit_log.max_offset
    wait_until(lambda: slave.commit_log.max_offset >= master_end, "the slave to follow its master")
    assert slave.commit_log.max_offset == master.commit_log.max_offset > 0


# -- (d) a TLS gateway and its clients ------------------------------------------------------------
def _gateway(suites: InProcessSuites, root: Path, tls: TlsConfig) -> Suite:
    suite = suites.start(
        ServeOptions(role="embedded", data_dir=root, listen="127.0.0.1:0", store=SMALL_STORE, tls=tls)
    )
    suites.wait_ready(suite)
    return suite


def test_tls_gateway_refuses_plaintext_clients(suites: InProcessSuites, tmp_path: Path, pki: Pki) -> None:
    gateway = _gateway(suites, tmp_path / "data", pki.server()).address
    with Admin(gateway, timeout_s=3) as admin, pytest.raises(ServiceNotAvailableError):
        admin.list_topics()
    untrusting = TlsConfig.load(ca=pki.other_ca)  # the server's CA is not this client's
    with Admin(gateway, timeout_s=3, tls=untrusting) as admin, pytest.raises(ServiceNotAvailableError):
        admin.list_topics()
    with Admin(gateway, tls=pki.client(cert=False)) as admin:
        admin.create_topic("Tls", 1)
        assert "Tls" in {t.topic_name for t in admin.list_topics()}
    with Producer(gateway, tls=pki.client(cert=False)) as producer:
        assert producer.send("Tls", b"hello").all_ok
    with PullConsumer(gateway, "g", "Tls", tls=pki.client(cert=False)) as consumer:
        assert [r.body for r in poll_until(consumer, 1, timeout_s=10)] == [b"hello"]


def test_gateway_with_client_auth_requires_a_client_certificate(
    suites: InProcessSuites, tmp_path: Path, pki: Pki
) -> None:
    gateway = _gateway(suites, tmp_path / "data", pki.server(client_auth=True)).address
    # Applications present certificates of the clients' CA; the internal CA's are not theirs.
    for refused in (pki.client(cert=False), pki.stranger(), pki.client()):
        with Admin(gateway, timeout_s=3, tls=refused) as admin, pytest.raises(ServiceNotAvailableError):
            admin.list_topics()
    with Admin(gateway, tls=pki.app()) as admin:
        assert admin.create_topic("Mutual", 1).topic_name == "Mutual"


def test_an_application_certificate_does_not_open_the_internal_ports(
    suites: InProcessSuites, tmp_path: Path, pki: Pki
) -> None:
    """A certificate handed to an application for a --tls-client-ca gateway is refused by the
    internal ports (it opened them when the gateway checked clients against --tls-ca), and one
    CA cannot serve both purposes."""
    commitlog = suites.start(_commitlog_options(tmp_path / "a", pki.server(client_auth=True)))
    assert commitlog.commit_log is not None
    before = commitlog.commit_log.max_offset
    forged = common_pb.Message(
        topic="rmq_sys_pop_journal", queue_id=0, body=b"x", properties={"POP_SEQ": "9"}
    )
    with _channel(commitlog.address, pki.app()) as channel, pytest.raises(grpc.RpcError) as refused:
        commitlog_grpc.CommitLogServiceStub(channel).Append(
            commitlog_pb.AppendRequest(messages=[forged]), timeout=5
        )
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE  # refused at the handshake
    assert commitlog.commit_log.max_offset == before
    with pytest.raises(ConfigError, match="another CA than --tls-ca"):
        TlsConfig.load(pki.cert, pki.key, pki.ca, client_ca=pki.ca, server=True)


def test_cli_client_commands_take_tls_options_and_variables(
    suites: InProcessSuites, tmp_path: Path, pki: Pki
) -> None:
    gateway = _gateway(suites, tmp_path / "data", pki.server()).address
    plain = mqstore("topic", "list", "-a", gateway)
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    flags = mqstore("--tls-ca", str(pki.ca), "topic", "create", "Cli", "-a", gateway)
    assert flags.returncode == 0, flags.stderr
    old = os.environ.get("MQSTORE_TLS_CA")
    os.environ["MQSTORE_TLS_CA"] = str(pki.ca)
    try:
        listed = mqstore("topic", "list", "-a", gateway)
    finally:
        if old is None:
            os.environ.pop("MQSTORE_TLS_CA")
        else:
            os.environ["MQSTORE_TLS_CA"] = old
    assert listed.returncode == 0 and "Cli" in listed.stdout, listed.stderr
    bad = mqstore("--tls-ca", str(tmp_path / "nope.pem"), "topic", "list", "-a", gateway)
    assert bad.returncode == 2 and "nope.pem does not exist" in bad.stderr and "Traceback" not in bad.stderr


# -- (e) mqstore serve: bad TLS files give one line, not a traceback -------------------------------
def test_serve_with_a_missing_or_mismatched_tls_file_fails_with_one_line(tmp_path: Path, pki: Pki) -> None:
    listen = ["--listen", "127.0.0.1:0", "--data", str(tmp_path / "d")]
    missing = mqstore("serve", *listen, "--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(pki.key))
    assert missing.returncode == 2
    assert "server.pem does not exist" in missing.stderr and "Traceback" not in missing.stderr
    mismatched = mqstore("serve", *listen, "--tls-cert", str(pki.cert), "--tls-key", str(pki.other_key))
    assert mismatched.returncode == 2 and "does not belong to the certificate" in mismatched.stderr
    old = os.environ.get("MQSTORE_TLS_CA")
    os.environ["MQSTORE_TLS_CA"] = str(tmp_path / "ca.pem")
    try:
        from_env = mqstore("serve", *listen, "--tls-cert", str(pki.cert), "--tls-key", str(pki.key))
    finally:
        if old is None:
            os.environ.pop("MQSTORE_TLS_CA")
        else:
            os.environ["MQSTORE_TLS_CA"] = old
    assert from_env.returncode == 2 and "ca.pem does not exist" in from_env.stderr
    assert "Traceback" not in from_env.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was opened


def test_internal_ports_without_mutual_tls_warn_at_start(
    suites: InProcessSuites, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="services.serve"):
        suites.start(_commitlog_options(tmp_path / "plain", None))
    warned = [r.getMessage() for r in caplog.records if "SECURITY" in r.getMessage()]
    assert len(warned) == 1 and "without TLS" in warned[0] and "trusted network" in warned[0]


# -- the official RocketMQ 5 client against a TLS gateway -----------------------------------------
@pytest.mark.rocketmq
def test_official_rocketmq_client_over_tls_trusting_the_ca_through_grpc_roots(
    suites: InProcessSuites, tmp_path: Path, pki: Pki
) -> None:
    """rocketmq-python-client 5.1.2 has a TLS switch (tls_enable) but no setting for roots or a
    client certificate: it trusts gRPC's default roots, which GRPC_DEFAULT_SSL_ROOTS_FILE_PATH
    replaces. Without that variable it refuses our CA; it cannot present a client certificate."""
    from tests.rocketmq.harness import run_driver

    gateway = _gateway(suites, tmp_path / "data", pki.server()).address
    with Admin(gateway, tls=pki.client(cert=False)) as admin:
        admin.create_topic("RmqTls", 2)
    roots = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(pki.ca)}
    specs = [{"body": f"tls-{i}", "tag": "t"} for i in range(3)]
    args = {"endpoint": gateway, "topic": "RmqTls", "tls": True, "request_timeout": 3}
    sent = run_driver("send", {**args, "messages": specs}, tmp_path / "p", env_extra=roots)
    assert len(sent["ids"]) == 3 and not sent["errors"]
    got = run_driver(
        "simple",
        {**args, "group": "tls-readers", "expect": 3, "timeout_s": 20},
        tmp_path / "c",
        env_extra=roots,
    )
    assert sorted(m["body"] for m in got["messages"]) == ["tls-0", "tls-1", "tls-2"]
    # Plaintext (the client's default) and TLS without our CA among the roots both fail: the
    # driver reports the send's error, or fails as a whole when the client's startup is refused.
    for name, extra, env in (("plaintext", {"tls": False}, roots), ("no-roots", {}, {})):
        one = {**args, **extra, "messages": specs[:1], "request_timeout": 2}
        try:
            failed = run_driver("send", one, tmp_path / name, timeout_s=60, env_extra=env)
        except AssertionError as exc:
            assert "client driver failed" in str(exc), exc
            continue
        assert not failed["ids"] and failed["errors"], name


def test_a_client_certificate_mapped_to_an_account_authenticates_own_api_calls(
    suites: InProcessSuites, tmp_path: Path, pki: Pki
) -> None:
    """Over mutual TLS an unsigned own-API call acts as the account whose certificateCommonName
    is its certificate's CN, with that account's permissions; other certificates still sign."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(
        f"""
accounts:
  - accessKey: billing
    secretKey: billing-secret
    certificateCommonName: {APP_CN}
    topicPerms: [Bills=PUB|SUB]
  - accessKey: ops
    secretKey: ops-secret
    admin: true
"""
    )
    options = ServeOptions(
        role="embedded",
        data_dir=tmp_path / "data",
        listen="127.0.0.1:0",
        store=SMALL_STORE,
        tls=pki.server(client_auth=True),
        acl_file=acl,
    )
    gateway = suites.start(options)
    suites.wait_ready(gateway)
    with Admin(gateway.address, tls=pki.app(), credentials=Credentials("ops", "ops-secret")) as admin:
        admin.create_topic("Bills", 1)
        admin.create_topic("Payroll", 1)
    with Admin(gateway.address, tls=pki.app()) as admin:  # no key: the certificate says who
        assert [t.topic_name for t in admin.list_topics()] == ["Bills"]
        with pytest.raises(PermissionDeniedError):
            admin.create_topic("Bills", 1, perm=4)
    with Producer(gateway.address, tls=pki.app()) as producer:
        assert producer.send("Bills", b"invoice").all_ok
        with pytest.raises(PermissionDeniedError):
            producer.send("Payroll", b"raise")
    with Admin(gateway.address, tls=pki.app(mapped=False)) as admin, pytest.raises(AuthenticationError):
        admin.list_topics()  # a clients' CA certificate that is no account's: it must sign


def test_a_forced_promotion_never_leaves_two_masters(
    suites: InProcessSuites, tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced while the old master answers, the promotion demotes it first; when it does not
    step down, the promotion is refused and the slave stays a slave (it used to promote anyway
    and ignore the failed demotion: two masters). The group runs over mutual TLS, as prod does."""
    from libstore import RoleSwitchError
    from services.commitlog.client import RemoteCommitLog

    # Each names the other before either starts: ports reserved up front, not the kernel's pick.
    master_options = _commitlog_options(tmp_path / "a", pki.server(), port=free_port(), ha_port=free_port())
    slave_options = _commitlog_options(
        tmp_path / "b", pki.server(), port=free_port(), ha_port=free_port(), brokerRole="SLAVE", brokerId=1
    )
    master_options.ha_peers = (slave_options.address,)
    slave_options.ha_peers = (master_options.address,)
    master = suites.start(master_options)
    slave = suites.start(slave_options)
    assert master.ha is not None and slave.ha is not None
    real_demote = RemoteCommitLog.demote

    async def refuse(self: RemoteCommitLog, master_address: str, min_epoch: int = 0) -> object:
        raise ServiceNotAvailableError("busy")

    monkeypatch.setattr(RemoteCommitLog, "demote", refuse)
    with pytest.raises(RoleSwitchError, match="did not step down"):
        suites.loop.run(slave.ha.promote(force=True))
    assert slave.ha.state().broker_role == "SLAVE" and master.ha.state().broker_role == "ASYNC_MASTER"
    monkeypatch.setattr(RemoteCommitLog, "demote", real_demote)
    promoted = suites.loop.run(slave.ha.promote(force=True))
    assert promoted.broker_role == "ASYNC_MASTER"
    assert master.ha.state().broker_role == "SLAVE"  # stepped down before the slave took over
