"""services._common.tls and the TLS side of start_grpc_server/open_channel: settings are checked
at load with one-line errors; a TLS port refuses plaintext, a mutual-TLS port refuses peers
without a certificate of its CA; the plaintext health port answers health only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from libstore import ConfigError
from services._common.remote import open_channel
from services._common.server import start_grpc_server
from services._common.tls import TlsConfig
from tests.tls_certs import Pki, make_pki

SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_load_reads_and_checks_the_files(pki: Pki) -> None:
    tls = TlsConfig.load(pki.cert, pki.key, pki.ca, server=True)
    assert tls is not None and tls.verifies_peers and not tls.client_auth
    assert tls.cert_pem == pki.cert.read_bytes() and tls.ca_pem == pki.ca.read_bytes()
    assert "BEGIN" not in repr(tls)  # the key never shows in logs
    assert TlsConfig.load() is None
    client = TlsConfig.load(ca=pki.ca)
    assert client is not None and client.cert_pem is None
    assert TlsConfig.from_env({"MQSTORE_TLS_CA": str(pki.ca), "MQSTORE_TLS_SERVER_NAME": "x"}) == (
        TlsConfig.load(ca=pki.ca, server_name="x")
    )
    assert TlsConfig.from_env({}) is None


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("missing.pem", "key", None), {}, "missing.pem does not exist"),
        (("cert", None, None), {}, "go together"),
        ((None, None, "ca"), {"server": True}, "serving TLS needs --tls-cert and --tls-key"),
        ((None, None, None), {"client_ca": "ca"}, "--tls-client-ca needs --tls-cert and --tls-key"),
        (("cert", "key", "ca"), {"client_ca": "ca"}, "another CA than --tls-ca"),
        (("cert", "other_key", "ca"), {}, "does not belong to the certificate"),
        (("cert", "key", "not_pem"), {}, "is not PEM"),
        (("cert", "key", "key"), {}, "holds no usable certificate"),
        (("cert", "key", "folder"), {}, "is a folder"),
    ],
)
def test_load_refuses_bad_settings_with_one_line(
    pki: Pki, tmp_path: Path, args: tuple[str | None, ...], kwargs: dict[str, object], message: str
) -> None:
    (tmp_path / "not_pem").write_text("hello\n")
    files = {
        "cert": pki.cert,
        "key": pki.key,
        "ca": pki.ca,
        "other_key": pki.other_key,
        "not_pem": tmp_path / "not_pem",
        "folder": tmp_path,
        "missing.pem": tmp_path / "missing.pem",
    }
    with pytest.raises(ConfigError, match=message) as info:
        named = {k: files.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
        TlsConfig.load(*(files[a] if a else None for a in args), **named)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def _health_status(channel: grpc.aio.Channel) -> asyncio.Future[int]:
    async def check() -> int:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        return reply.status

    return asyncio.ensure_future(check())


def test_mutual_tls_port_refuses_peers_without_a_certificate_of_its_ca(pki: Pki) -> None:
    async def scenario() -> None:
        server = await start_grpc_server(
            "127.0.0.1:0",
            lambda s: [],
            tls=pki.server(),
            require_client_auth=True,
            health_address="127.0.0.1:0",
        )
        await server.set_serving(True)
        address = f"127.0.0.1:{server.port}"
        try:
            async with open_channel(address, pki.client()) as channel:
                assert await _health_status(channel) == SERVING
            for refused in (None, pki.client(cert=False), pki.stranger()):
                async with open_channel(address, refused) as channel:
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await _health_status(channel)
                    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            # A client that does not trust the server's CA refuses it too.
            wrong_roots = TlsConfig.load(pki.other_cert, pki.other_key, pki.other_ca)
            async with open_channel(address, wrong_roots) as channel:
                with pytest.raises(grpc.aio.AioRpcError):
                    await _health_status(channel)
            # The plaintext health port: health only, nothing else is registered there.
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
                assert await _health_status(channel) == SERVING
                reflection = channel.unary_unary("/mqstore.v1.CommitLogService/Append")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await reflection(b"", timeout=3)
                assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            await server.stop(0)

    asyncio.run(scenario())


def test_tls_port_without_client_auth_takes_clients_without_certificates(pki: Pki) -> None:
    async def scenario() -> None:
        server = await start_grpc_server("127.0.0.1:0", lambda s: [], tls=pki.server())
        await server.set_serving(True)
        address = f"127.0.0.1:{server.port}"
        try:
            async with open_channel(address, pki.client(cert=False)) as channel:
                assert await _health_status(channel) == SERVING
            async with open_channel(address, None) as channel:  # plaintext
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await _health_status(channel)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(0)

    asyncio.run(scenario())


def test_server_name_override_checks_that_name_instead_of_the_host(pki: Pki) -> None:
    async def scenario() -> None:
        server = await start_grpc_server("127.0.0.1:0", lambda s: [], tls=pki.server())
        await server.set_serving(True)
        try:
            # "localhost" is in the certificate: dialling 127.0.0.1 and expecting it works...
            good = TlsConfig.load(ca=pki.ca, server_name="localhost")
            async with open_channel(f"127.0.0.1:{server.port}", good) as channel:
                assert await _health_status(channel) == SERVING
            # ...a name the certificate does not carry fails: verification stays on.
            bad = TlsConfig.load(ca=pki.ca, server_name="elsewhere.example")
            async with open_channel(f"127.0.0.1:{server.port}", bad) as channel:
                with pytest.raises(grpc.aio.AioRpcError):
                    await _health_status(channel)
        finally:
            await server.stop(0)

    asyncio.run(scenario())
