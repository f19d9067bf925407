"""Credentials made for one deployment: a TLS CA and server certificate, SuperNode keys.

`make_tls` writes a self-signed root CA (``ca.crt``) and a SuperLink certificate
(``server.pem``, key ``server.key``) signed by it, valid for the given IP addresses
(subjectAltName) and ``localhost``, for one day. `make_node_key` writes a P-384 EC
key pair as Flower 1.42 reads them: the private key in OpenSSH PEM
(``flower-supernode --auth-supernode-private-key``), the public key in OpenSSH form
(``flwr supernode register PUBLIC_KEY``). Everything is generated with the
`cryptography` package (a dependency of flwr), nothing is downloaded.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALIDITY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the run's CA certificate and the SuperLink's certificate and key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKey:
    """Paths of one SuperNode's private key (OpenSSH PEM) and public key (OpenSSH)."""

    private: Path
    public: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "flwr-admm test deployment"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write_private(
    path: Path, key: ec.EllipticCurvePrivateKey, fmt: serialization.PrivateFormat
) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())
    )
    path.chmod(0o600)


def make_tls(directory: Path, addresses: list[str]) -> TlsFiles:
    """Write a CA and a server certificate for `addresses` into `directory`.

    The server certificate's subjectAltName lists every IP in `addresses` and
    ``localhost``; it is signed by the CA (ECDSA P-384, SHA-384), valid from one minute
    ago for `VALIDITY`.
    """
    if not addresses:
        raise ValueError("addresses: need at least one IP address for the certificate")
    ips = [ipaddress.ip_address(address) for address in addresses]  # ValueError if bad
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = _name("flwr-admm test CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .sign(ca_key, hashes.SHA384())
    )
    server_key = ec.generate_private_key(ec.SECP384R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    names += [x509.IPAddress(ip) for ip in ips]
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("flwr-admm SuperLink"))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA384())
    )
    files = TlsFiles(directory / "ca.crt", directory / "server.pem", directory / "server.key")
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(files.server_key, server_key, serialization.PrivateFormat.PKCS8)
    return files


def make_node_key(directory: Path, name: str) -> NodeKey:
    """Write a fresh P-384 key pair ``<name>`` / ``<name>.pub`` into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    files = NodeKey(directory / name, directory / f"{name}.pub")
    _write_private(files.private, key, serialization.PrivateFormat.OpenSSH)
    files.public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + b"\n"
    )
    return files
