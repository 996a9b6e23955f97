"""Certificates for the lab's Kubernetes: one CA, serving and client certificates, as kubeadm
lays them out (the subjects Kubernetes' authorizers read: `CN=system:node:NAME, O=system:nodes`
for kubelets, `system:kube-controller-manager`, `system:kube-scheduler`, and so on)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


class Pki:
    """A CA in `directory` (ca.crt, ca.key), made on first use, and certificates signed by it."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        if not (self.dir / "ca.crt").exists():
            self._make_ca()
        self._ca_key = serialization.load_pem_private_key(
            (self.dir / "ca.key").read_bytes(), password=None
        )
        self._ca_cert = x509.load_pem_x509_certificate((self.dir / "ca.crt").read_bytes())

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    def _make_ca(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpustack-lab-ca")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS * 10))
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
        _write_private(self.dir / "ca.key", _key_pem(key))
        (self.dir / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        common_name: str,
        organizations: tuple[str, ...] = (),
        *,
        server: bool = False,
        client: bool = True,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> tuple[Path, Path]:
        """`name`.crt and `name`.key (kept when they exist); returns their paths."""
        crt, key_path = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        if crt.exists() and key_path.exists():
            return crt, key_path
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        alt = [x509.DNSName(d) for d in dns] + [
            x509.IPAddress(ipaddress.ip_address(i)) for i in ips
        ]
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        _write_private(key_path, _key_pem(key))
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return crt, key_path

    def service_account_keys(self) -> tuple[Path, Path]:
        """sa.key (signing) and sa.pub (verification) for ServiceAccount tokens."""
        private, public = self.dir / "sa.key", self.dir / "sa.pub"
        if not private.exists():
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            _write_private(private, _key_pem(key))
            public.write_bytes(
                key.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )
        return private, public


def kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str) -> Path:
    """A kubeconfig with the certificates embedded (it can be copied anywhere)."""
    import base64

    import yaml

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpustack-lab",
                "cluster": {"server": server, "certificate-authority-data": b64(ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)},
            }
        ],
        "contexts": [
            {"name": f"{user}@gpustack-lab", "context": {"cluster": "gpustack-lab", "user": user}}
        ],
        "current-context": f"{user}@gpustack-lab",
    }
    _write_private(path, yaml.safe_dump(doc, sort_keys=False).encode())
    return path
