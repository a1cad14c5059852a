"""Shared fixtures: a per-session cache (FMNIST IDX copy, partitions) and small configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# tests/mutations/: the mutation suite (its runner, table and data), not tests; pytest never
# collects it, even when named on the command line
collect_ignore = ["mutations"]

# Under pytest-xdist (`-n 2`, the fast tier in README and CI: one worker per core) each
# worker's torch computes on one thread, so two workers do not fight over two cores
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cache")
    os.environ["FLOWER_PFL_CACHE"] = str(path)
    return path


def small_config(**overrides):
    """A validated config on a small real FMNIST subset."""
    from flower_pfl import config

    tree = {"rounds": 3, "clients": 10, "fraction-fit": 1.0, "model": "cnn", "seed": 0,
            "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 6000},
            "train": {"epochs": 1, "batch-size": 32, "lr": 0.05}}
    return config.validate(config.merge(tree, overrides), source="test")


def tiny_run_yaml(tmp_path: Path, name: str = "run.yaml", **changes) -> Path:
    """A run's YAML file in ``tmp_path``: FedAvg, the MCLR model on a real FMNIST subset,
    results under ``tmp_path/out/run``; ``changes`` replace top-level keys (``data=...``
    replaces the whole data section)."""
    import yaml

    tree = {"strategy": "fedavg", "rounds": 2, "clients": 4, "model": "mclr", "seed": 3,
            "output-dir": str(tmp_path / "out"), "run-name": "run",
            "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 3000}}
    tree.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.fixture
def switch_lines():
    """The lines :func:`flower_pfl.tuned.switch.install` logs, as (level, text), and the
    logger to hand it; every replacement uninstalled before and after (the engine tests)."""
    from flower_pfl.tuned import switch

    switch.uninstall()
    out: list[tuple[int, str]] = []
    yield out, lambda level, fmt, text: out.append((level, fmt % text))
    switch.uninstall()
