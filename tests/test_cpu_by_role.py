"""benchmarks/cpu_by_role.py: core-seconds per round by role, from /proc snapshots.

By hand on three snapshots (two rounds): a process' CPU between the first and the last
snapshot, per round, summed by role; a process born after the first counts from 0; idle is
cores x wall minus everything; and a live reading of this process' own CPU time."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from cpu_by_role import CpuClock, cpu_seconds, table  # noqa: E402 - benchmarks/


def test_per_round_by_hand(tmp_path):
    clock = CpuClock(tmp_path)
    clock.roles = {1: "actor", 2: "actor", 3: "serverapp", 4: "not the run"}
    clock.snaps = [
        (10.0, 100.0, {1: 5.0, 2: 7.0, 3: 1.0, 4: 0.5}),
        (11.5, 102.6, {1: 6.2, 2: 8.1, 3: 1.3, 4: 0.5}),
        (13.0, 105.0, {1: 7.6, 2: 9.4, 3: 1.5, 4: 0.9, 5: 0.2}),  # 5: born in round 2
    ]
    out = clock.per_round(cores=2)
    assert out is not None
    assert abs(out["actor"] - ((7.6 - 5.0) + (9.4 - 7.0)) / 2) < 1e-9      # 2.5
    assert abs(out["serverapp"] - 0.25) < 1e-9
    assert abs(out["not the run"] - (0.4 + 0.2) / 2) < 1e-9                 # 4 and 5
    assert abs(out["wall"] - 1.5) < 1e-9
    assert abs(out["idle"] - (2 * 1.5 - 2.5 - 0.25 - 0.3)) < 1e-9           # -0.05: over
    assert abs(out["machine"] - 2.5) < 1e-9
    text = table({"fedavg": out}, cores=2)
    assert "| actor | 2.500 (83%) |" in text and "| = 2 cores x s/round | 3.000 |" in text


def test_one_round_is_not_enough(tmp_path):
    clock = CpuClock(tmp_path)
    clock.snaps = [(0.0, 0.0, {})]
    assert clock.per_round() is None


def test_this_process_cpu_time_is_read():
    before = cpu_seconds()[os.getpid()]
    end = time.process_time() + 0.3
    while time.process_time() < end:  # burn 0.3 s of CPU
        pass
    assert cpu_seconds()[os.getpid()] - before >= 0.25
