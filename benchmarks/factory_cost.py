"""Per-round cost of a user's model (``model: module:factory``) vs the built-in of the same
architecture.

The factory path wraps the user's ``nn.Module`` (flower_pfl/learning/user_model.py): an
extra module level (``net.``), a per-process import and seeded build, the preflight-only
checks.  This runs FedAvg in one process (flower_pfl/running/inprocess.py, Flower's
message path) on the same small FMNIST subset twice -- ``model: cnn`` and a factory that
builds the very same CNN (layer for layer, so the seeded weights and every round's arrays
are bit for bit equal: checked) -- alternating the arms ``--repeats`` times, and prints
each arm's per-round wall time (median over rounds 2.. of every repeat; round 1 builds
and caches the model) and the factory's overhead in percent.  The issue's bar: <= 1%.

    .venv/bin/python benchmarks/factory_cost.py [--rounds 6] [--repeats 3] [--clients 6]

Run it on a quiet machine (load < 0.5): the difference measured is small against noise.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from flower_pfl import config as config_mod
from flower_pfl.running import inprocess

SAME_CNN = '''
import torch
from torch import nn


class CNN(nn.Module):
    """flower_pfl.learning.models.CNN, layer for layer (same seeded weights)."""

    def __init__(self, channels=1, height=28, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        side = ((height - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(32 * side * side, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def make(**kwargs):
    return CNN(**kwargs)
'''


def one_run(cfg: config_mod.RunConfig, out: Path) -> tuple[list[float], list]:
    """(per-round wall seconds, the final global arrays) of one in-process FedAvg run."""
    marks = [time.perf_counter()]
    strategy = inprocess.run(cfg, out, on_round=lambda s, r: marks.append(time.perf_counter()))
    return list(np.diff(marks)), strategy.global_arrays


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=6)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="factory-cost-") as tmp:
        folder = Path(tmp)
        (folder / "samecnn_bench.py").write_text(SAME_CNN)
        (folder / "run.yaml").write_text("# the factory's module is beside this file\n")
        tree = {"strategy": "fedavg", "rounds": args.rounds, "clients": args.clients,
                "fraction-fit": 1.0, "model": "cnn", "seed": 0,
                "data": {"dataset": "fmnist", "partition": "iid", "subsample": 3000},
                "train": {"epochs": 1, "batch-size": 32, "lr": 0.05}}
        builtin = config_mod.validate(tree, source="factory_cost")
        factory = dataclasses.replace(
            builtin, source=str(folder / "run.yaml"),
            values={**builtin.values, "model": "samecnn_bench:make", "model-args": {}})
        times: dict[str, list[float]] = {"built-in cnn": [], "factory cnn": []}
        finals = {}
        for rep in range(args.repeats):
            for label, cfg in (("built-in cnn", builtin), ("factory cnn", factory)):
                per_round, final = one_run(cfg, folder / f"{label[:5]}-{rep}")
                times[label] += per_round[1:]
                finals[label] = final
        same = all(np.array_equal(a, b) for a, b in zip(finals["built-in cnn"],
                                                         finals["factory cnn"]))
    med = {label: statistics.median(t) for label, t in times.items()}
    for label, t in times.items():
        print(f"{label:13s} median {med[label] * 1000:8.1f} ms/round over {len(t)} rounds "
              f"(min {min(t) * 1000:.1f}, max {max(t) * 1000:.1f})")
    overhead = 100.0 * (med["factory cnn"] / med["built-in cnn"] - 1.0)
    print(f"factory overhead: {overhead:+.2f}% per round; final global models bit for bit "
          f"equal: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
