"""Deployment set-up that needs no running process: paths as typed, GPUs that exist."""

from __future__ import annotations

import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Flower installs tomli on 3.10
    import tomli as tomllib

from flower_pfl.running.deploy import Deployment, check_gpus, make_ca
from flower_pfl.running.procs import LaunchError


def test_relative_certificate_paths_reach_flower_absolute(tmp_path, monkeypatch):
    """`flower-pfl deploy --certs certs/` as the README types it: Flower's config.toml
    refuses a relative root-certificates path, so it must arrive resolved."""
    monkeypatch.chdir(tmp_path)
    make_ca("certs")
    certs = {"ca": "certs/ca.crt", "cert": "certs/server.pem", "key": "certs/server.key"}
    dep = Deployment("work", 3, certs, data_root="data")
    toml = tomllib.loads((tmp_path / "work" / "flwr-home" / "config.toml").read_text())
    root = toml["superlink"]["deploy"]["root-certificates"]
    assert root == str(tmp_path / "certs" / "ca.crt")
    assert all(p.is_absolute() and p.is_file() for p in dep.certs.values())
    assert dep.data_root == str(tmp_path / "data") and dep.workdir.is_absolute()


def test_gpus_on_a_machine_without_cuda_is_an_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LaunchError, match=r"--gpus 0,1: this machine has no CUDA device"):
        check_gpus(["0", "1"])
    check_gpus([])  # no --gpus: the CPU, silently and rightly


def test_gpus_naming_a_device_that_is_not_there_is_an_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_gpus(["0", "1"])
    with pytest.raises(LaunchError, match=r"no such device \['2'\]; this machine has 2"):
        check_gpus(["1", "2"])


def test_certs_for_a_host_name_it_and_loopback(tmp_path):
    """The server certificate names the SuperLink's address (what the SuperNodes check) and
    loopback (a SuperLink on 0.0.0.0 starts its ServerApp against 127.0.0.1)."""
    import ipaddress

    from cryptography import x509
    from cryptography.x509.oid import ExtensionOID

    paths = make_ca(tmp_path, ["10.213.7.1", "server.example.org"])
    cert = x509.load_pem_x509_certificate(paths["cert"].read_bytes())
    san = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.213.7.1"),
                                                       ipaddress.ip_address("127.0.0.1"),
                                                       ipaddress.ip_address("::1")]
    assert san.get_values_for_type(x509.DNSName) == ["server.example.org", "localhost"]


def test_site_commands_refuse_bad_arguments_before_starting_anything(tmp_path, monkeypatch,
                                                                     capsys):
    from flower_pfl import cli

    monkeypatch.chdir(tmp_path)
    make_ca("certs")
    assert cli.main(["superlink", "--certs", "certs"]) == 2  # no key to register
    assert "no public keys to register" in capsys.readouterr().out
    assert cli.main(["superlink", "--certs", "nope", "--public-keys", "a.pub"]) == 2
    assert "missing certificate files" in capsys.readouterr().out
    assert cli.main(["supernode", "--superlink", "h:9092", "--partition-id", "0",
                        "--num-partitions", "2", "--state-dir", "s"]) == 2
    assert "--ca ca.crt and --key <node key> are needed" in capsys.readouterr().out
    assert cli.main(["supernode", "--superlink", "h:9092", "--insecure", "--partition-id",
                        "2", "--num-partitions", "2", "--state-dir", "s"]) == 2
    assert "--partition-id 2 is outside [0, 2)" in capsys.readouterr().out
    assert cli.main(["submit", "--superlink", "h:9092", "--ca", "certs/ca.crt",
                        "--set", "bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().out
    assert not (tmp_path / "superlink").exists() and not (tmp_path / "s").exists()
