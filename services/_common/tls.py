"""TLS settings shared by every mqstore server and channel (``--tls-cert``, ``--tls-key``,
``--tls-ca``; ``MQSTORE_TLS_CERT``, ``MQSTORE_TLS_KEY``, ``MQSTORE_TLS_CA``).

One :class:`TlsConfig` per process, loaded and checked once at start (:meth:`TlsConfig.load`):

* a server (``mqstore serve``) needs a certificate and its key; with a CA as well, the internal
  ports (commitlog, dispatch, index, HA) require a client certificate signed by that CA (mutual
  TLS), and the gateway port requires one only with a clients' CA (``--tls-client-ca``): the
  CA that signs applications' certificates, which must not be the internal one (a certificate
  handed to an application would otherwise open the internal ports too);
* every channel a process opens (to another service, or a client's to the gateway) verifies the
  server's certificate against the CA (the system's roots when none is given) and presents the
  process's own certificate, when it has one, as its client certificate.

Host names are checked: a certificate must name the address a peer dials (an IP SAN such as
127.0.0.1, or the DNS name). ``server_name`` (``--tls-server-name``) makes every channel of the
process expect that name instead (gRPC's ``grpc.ssl_target_name_override``), for peers reached
by addresses their certificates do not list; verification stays on.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from libstore import ConfigError

ENV_CERT = "MQSTORE_TLS_CERT"
ENV_KEY = "MQSTORE_TLS_KEY"
ENV_CA = "MQSTORE_TLS_CA"
ENV_SERVER_NAME = "MQSTORE_TLS_SERVER_NAME"


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a folder, not a PEM file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{what} {path} is not PEM (no -----BEGIN line)")
    return data


@dataclass(frozen=True)
class TlsConfig:
    """PEM files (paths) and their contents, as loaded by :meth:`load`; build it with
    :meth:`load` (or :meth:`from_env`), which checks them.

    ``cert_pem``/``key_pem``: this process's certificate chain and private key (None: a client
    without a certificate). ``ca_pem``: the CA certificates peers are verified against (None: the
    system's roots for channels, and servers do not ask for client certificates).
    ``client_ca_pem``: the CA the gateway port verifies client certificates against (None: it
    asks for none). ``server_name``: the name channels expect in servers' certificates instead
    of the dialled host ("" for the host).
    """

    cert_file: Path | None = None
    key_file: Path | None = None
    ca_file: Path | None = None
    client_ca_file: Path | None = None
    server_name: str = ""
    cert_pem: bytes | None = field(default=None, repr=False)
    key_pem: bytes | None = field(default=None, repr=False)
    ca_pem: bytes | None = field(default=None, repr=False)
    client_ca_pem: bytes | None = field(default=None, repr=False)

    @property
    def client_auth(self) -> bool:
        """The gateway port requires client certificates (a clients' CA is configured)."""
        return self.client_ca_pem is not None

    @classmethod
    def load(
        cls,
        cert: str | os.PathLike[str] | None = None,
        key: str | os.PathLike[str] | None = None,
        ca: str | os.PathLike[str] | None = None,
        *,
        client_ca: str | os.PathLike[str] | None = None,
        server_name: str = "",
        server: bool = False,
    ) -> TlsConfig | None:
        """Read and check the PEM files; None when none is given (TLS off).

        ``server``: the process listens, so it needs ``cert`` and ``key``. Raises ConfigError
        (one line, naming the file) when a file is missing, unreadable or not PEM, when only one
        of ``cert``/``key`` is given, when the key does not belong to the certificate, when the
        CA file holds no usable certificate, when ``client_ca`` comes without a certificate to
        serve with, or when it is the internal CA ``ca`` itself.
        """
        cert_file = Path(cert) if cert else None
        key_file = Path(key) if key else None
        ca_file = Path(ca) if ca else None
        client_ca_file = Path(client_ca) if client_ca else None
        if client_ca_file is not None and cert_file is None:
            raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key (the gateway serves TLS)")
        if cert_file is None and key_file is None and ca_file is None:
            return None
        if (cert_file is None) != (key_file is None):
            raise ConfigError("--tls-cert and --tls-key go together: give both or neither")
        if server and cert_file is None:
            raise ConfigError("serving TLS needs --tls-cert and --tls-key (--tls-ca alone is for clients)")
        cert_pem = _read(cert_file, "TLS certificate") if cert_file else None
        key_pem = _read(key_file, "TLS key") if key_file else None
        ca_pem = _read(ca_file, "TLS CA file") if ca_file else None
        client_ca_pem = _read(client_ca_file, "TLS clients' CA file") if client_ca_file else None
        if client_ca_pem is not None and client_ca_pem == ca_pem:
            raise ConfigError(
                "--tls-client-ca must be another CA than --tls-ca: the internal ports take every "
                "certificate --tls-ca signed, so an application's certificate would open them too"
            )
        if cert_file is not None and key_file is not None:
            try:
                ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_file, key_file)
            except ssl.SSLError as exc:
                if "KEY_VALUES_MISMATCH" in str(exc):
                    raise ConfigError(
                        f"TLS key {key_file} does not belong to the certificate {cert_file}"
                    ) from None
                reason = exc.reason or exc
                raise ConfigError(f"TLS certificate {cert_file} or key {key_file}: {reason}") from None
        for path in (ca_file, client_ca_file):
            if path is not None:
                try:
                    ssl.create_default_context(cafile=path)
                except ssl.SSLError as exc:
                    reason = exc.reason or exc
                    raise ConfigError(f"TLS CA file {path} holds no usable certificate: {reason}") from None
        return cls(
            cert_file,
            key_file,
            ca_file,
            client_ca_file,
            server_name,
            cert_pem,
            key_pem,
            ca_pem,
            client_ca_pem,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, server: bool = False) -> TlsConfig | None:
        """:meth:`load` from MQSTORE_TLS_CERT, MQSTORE_TLS_KEY, MQSTORE_TLS_CA and
        MQSTORE_TLS_SERVER_NAME in ``env`` (default: os.environ); None when none is set."""
        env = os.environ if env is None else env
        return cls.load(
            env.get(ENV_CERT) or None,
            env.get(ENV_KEY) or None,
            env.get(ENV_CA) or None,
            server_name=env.get(ENV_SERVER_NAME, ""),
            server=server,
        )

    @property
    def verifies_peers(self) -> bool:
        """Internal ports require client certificates (a CA is configured)."""
        return self.ca_pem is not None

    def server_credentials(
        self, *, require_client_auth: bool, clients: bool = False
    ) -> grpc.ServerCredentials:
        """Credentials for a listening port: this process's certificate; with
        ``require_client_auth``, a handshake without a client certificate signed by the CA
        fails: the internal CA, or with ``clients`` (the gateway port) the clients' CA. Raises
        ConfigError without a certificate, or when client auth is asked without that CA."""
        if self.cert_pem is None or self.key_pem is None:
            raise ConfigError("serving TLS needs --tls-cert and --tls-key")
        roots = self.client_ca_pem if clients else self.ca_pem
        if require_client_auth and roots is None:
            raise ConfigError(
                "requiring client certificates needs " + ("--tls-client-ca" if clients else "--tls-ca")
            )
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=roots if require_client_auth else None,
            require_client_auth=require_client_auth,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials for a channel: servers verified against the CA (system roots without one),
        this process's certificate presented as the client certificate when it has one."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )

    def channel_options(self) -> list[tuple[str, str]]:
        """Extra channel options: the expected server name when ``server_name`` is set."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
