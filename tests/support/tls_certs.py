"""TLS files for the tests: a CA, a server certificate for ``127.0.0.1`` and
client certificates signed by the CA, made with the ``cryptography`` package
(no ``openssl`` command needed)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from processor.embedded import TlsFiles

_DAYS = datetime.timedelta(days=3)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_pem(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    path.with_suffix(".key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))  # fmt: skip
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey, extensions: list[tuple[x509.ExtensionType, bool]],
) -> x509.Certificate:  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer.subject if issuer is not None else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _DAYS)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False
        )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical)
    return builder.sign(issuer_key, hashes.SHA256())


def _usage(**enabled: bool) -> x509.KeyUsage:
    names = ["digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
             "key_agreement", "key_cert_sign", "crl_sign", "encipher_only", "decipher_only"]
    return x509.KeyUsage(**{name: enabled.get(name, False) for name in names})


def make_tls_files(directory: Path) -> TlsFiles:
    """Write a throwaway CA (ca.crt, ca.key) and a server certificate for
    127.0.0.1/localhost signed by it (server.crt, server.key) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = _issue("processor test CA", ca_key, None, ca_key, [
        (x509.BasicConstraints(ca=True, path_length=None), True),
        (_usage(key_cert_sign=True, crl_sign=True), True),
    ])  # fmt: skip
    _write_pem(directory / "ca", ca_key, ca)
    server_key = _key()
    server = _issue("localhost", server_key, ca, ca_key, [
        (x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                      x509.DNSName("localhost")]), False),
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (_usage(digital_signature=True, key_encipherment=True), True),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                ExtendedKeyUsageOID.CLIENT_AUTH]), False),
    ])  # fmt: skip
    _write_pem(directory / "server", server_key, server)
    return TlsFiles(
        cert_file=directory / "server.crt",
        key_file=directory / "server.key",
        ca_file=directory / "ca.crt",
    )


def make_client_certificate(
    ca: TlsFiles, directory: Path, name: str = "client"
) -> tuple[Path, Path]:
    """A client certificate (clientAuth) signed by ``ca``'s CA: (cert, key) files."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert = x509.load_pem_x509_certificate(ca.ca_file.read_bytes())
    ca_key = serialization.load_pem_private_key(
        ca.ca_file.with_suffix(".key").read_bytes(), password=None
    )
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    cert = _issue(f"processor {name}", key, ca_cert, ca_key, [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (_usage(digital_signature=True), True),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False),
    ])  # fmt: skip
    _write_pem(directory / name, key, cert)
    return directory / f"{name}.crt", directory / f"{name}.key"
