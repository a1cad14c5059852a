"""Throwaway TLS material for a deployment: a CA and the SuperLink's certificate, and the
SuperNodes' authentication key pairs (``flower-pfl certs`` / ``flower-pfl node-key``; the
tests and benchmarks).  Testing only: the CA's key is not kept.

Certificates name the given hosts AND loopback: a SuperLink on 0.0.0.0 starts its
ServerApp against 127.0.0.1 (Flower 1.42, ``resolve_bind_address``), which checks them.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path
from typing import Sequence

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def make_ca(directory: str | Path, hosts: Sequence[str] = LOOPBACK,
            days: int = 30) -> dict[str, Path]:
    """A throwaway CA and server certificate for ``hosts`` + loopback (testing only; the
    first host is its common name)."""
    hosts = list(dict.fromkeys([*hosts, *LOOPBACK]))
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flower-pfl test CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP384R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": out / "ca.crt", "cert": out / "server.pem", "key": out / "server.key"}
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    os.chmod(paths["key"], 0o600)
    return paths


def make_node_key(directory: str | Path, name: str) -> tuple[Path, Path]:
    """An EC (P-384) key pair in OpenSSH format: (private key, public key) paths."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = out / f"{name}.key", out / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    os.chmod(private, 0o600)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return private, public
