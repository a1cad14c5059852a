"""Deployment set-up that needs no running process: paths as typed, GPUs that exist."""

from __future__ import annotations

import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Flower installs tomli on 3.10
    import tomli as tomllib

from flower_pfl.deploy import Deployment, check_gpus, make_ca
from flower_pfl.procs import LaunchError


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
