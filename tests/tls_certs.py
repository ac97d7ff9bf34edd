"""Throw-away certificates for the TLS tests: a CA, a certificate it signs for 127.0.0.1 and
localhost (server and client use: every mqstore process presents the same kind), and a second,
unrelated CA with its own certificate (a stranger's). EC P-256 keys, so they are fast to make."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services._common.tls import TlsConfig

APP_CN = "billing-app"
UNMAPPED_CN = "unmapped-app"


@dataclass(frozen=True)
class Pki:
    """PEM files under one folder: ``ca`` (the internal CA) signs ``cert``/``key``; ``other_ca``
    signs ``other_cert``/``other_key`` (same names, another CA); ``clients_ca`` (the CA of
    applications' certificates, for a gateway requiring them) signs ``app_cert``/``app_key``
    (common name APP_CN) and ``unmapped_cert``/``unmapped_key`` (UNMAPPED_CN)."""

    ca: Path
    cert: Path
    key: Path
    other_ca: Path
    other_cert: Path
    other_key: Path
    clients_ca: Path
    app_cert: Path
    app_key: Path
    unmapped_cert: Path
    unmapped_key: Path

    def server(self, *, client_auth: bool = False) -> TlsConfig:
        """The settings every trusted process runs with (certificate, key, CA); with
        ``client_auth``, the gateway port requires certificates of the clients' CA."""
        client_ca = self.clients_ca if client_auth else None
        tls = TlsConfig.load(self.cert, self.key, self.ca, client_ca=client_ca, server=True)
        assert tls is not None
        return tls

    def client(self, *, cert: bool = True) -> TlsConfig:
        """A client trusting the CA, with (``cert``) or without the CA's client certificate."""
        tls = TlsConfig.load(self.cert if cert else None, self.key if cert else None, self.ca)
        assert tls is not None
        return tls

    def stranger(self) -> TlsConfig:
        """A client that trusts the right CA but presents a certificate of the other CA."""
        tls = TlsConfig.load(self.other_cert, self.other_key, self.ca)
        assert tls is not None
        return tls

    def app(self, *, mapped: bool = True) -> TlsConfig:
        """A client trusting the CA and presenting an application certificate of the clients'
        CA: CN APP_CN, or UNMAPPED_CN when not ``mapped``."""
        if mapped:
            tls = TlsConfig.load(self.app_cert, self.app_key, self.ca)
        else:
            tls = TlsConfig.load(self.unmapped_cert, self.unmapped_key, self.ca)
        assert tls is not None
        return tls

    def serve_args(self) -> list[str]:
        return ["--tls-cert", str(self.cert), "--tls-key", str(self.key), "--tls-ca", str(self.ca)]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _ca(cn: str, folder: Path, stem: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    path = folder / f"{stem}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key, path


def _leaf(
    ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, cn: str, folder: Path, stem: str
) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)
    return cert_path, key_path


def make_pki(folder: Path) -> Pki:
    """Write the three CAs and their certificates into ``folder`` (created)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key, ca_path = _ca("mqstore test CA", folder, "ca")
    cert, key = _leaf(ca, ca_key, "mqstore", folder, "mqstore")
    other, other_key, other_path = _ca("unrelated CA", folder, "other-ca")
    other_cert, other_leaf_key = _leaf(other, other_key, "mqstore", folder, "other")
    clients, clients_key, clients_path = _ca("applications CA", folder, "clients-ca")
    app_cert, app_key = _leaf(clients, clients_key, APP_CN, folder, "app")
    unmapped_cert, unmapped_key = _leaf(clients, clients_key, UNMAPPED_CN, folder, "unmapped")
    return Pki(
        ca_path,
        cert,
        key,
        other_path,
        other_cert,
        other_leaf_key,
        clients_path,
        app_cert,
        app_key,
        unmapped_cert,
        unmapped_key,
    )
