"""benchmarks/gpu_check.sh: its dry run on a CPU-only machine, and the report's arithmetic.

The dry run writes the check's YAMLs and checks every planned command without running it:
flower-pfl's own parsers and configuration validator, the supernode plan, the data folder.
A broken plan (a data folder that is not there, a strategy that does not exist, both given
through the environment as a user would) must fail it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402


def dry_run(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable,
                               "OUT": str(tmp_path / "out"), **env})


def test_dry_run_checks_every_command_and_passes(tmp_path):
    got = dry_run(tmp_path)
    assert got.returncode == 0, got.stdout + got.stderr
    plan = (tmp_path / "out" / "plan.txt").read_text().splitlines()
    assert len(plan) == 13
    assert f"dry run: {len(plan)} commands, 0 with problems" in got.stdout
    for what in ("run sim-cnn-gpu.yaml (cnn, cuda)", "run sim-resnet18-cpu.yaml (resnet18, cpu)",
                 "supernode partition 0", "supernode partition 1", "superlink", "submit"):
        assert f"ok   flower-pfl {what}" in got.stdout, what
    assert sum("--gpu' '0'" in line for line in plan) == 2  # both SuperNodes on GPU 0
    gpu = yaml.safe_load((tmp_path / "out" / "sim-cnn-gpu.yaml").read_text())
    assert gpu["device"] == "cuda" and gpu["client-resources"]["num-gpus"] == 0.1


@pytest.mark.parametrize("env, reason", [
    ({"DATA_ROOT": "/nonexistent/fmnist"}, "data.root /nonexistent/fmnist: no such folder"),
    ({"STRATEGY": "fedavgg"}, "fedavgg"),
])
def test_dry_run_fails_on_a_broken_plan(tmp_path, env, reason):
    got = dry_run(tmp_path, **env)
    assert got.returncode == 1, got.stdout + got.stderr
    assert reason in got.stdout
    assert "FAIL flower-pfl run" in got.stdout
    assert " 0 with problems" not in got.stdout


def test_a_supernode_gpu_that_is_no_number_fails_the_dry_run(tmp_path):
    py = sys.executable
    ok = [py, "-m", "flower_pfl.cli", "supernode", "--superlink", "127.0.0.1:19092",
          "--insecure", "--partition-id", "1", "--num-partitions", "2",
          "--state-dir", str(tmp_path / "s")]
    assert gpu_check.check_command(ok + ["--gpu", "0"], cuda=False)[1] == []
    assert gpu_check.check_command(ok + ["--gpu", "x"], cuda=False)[1] == \
        ["--gpu x: not a CUDA device number"]
    bad = ok[:-4] + ["--num-partitions", "1", "--state-dir", str(tmp_path / "s")]
    with pytest.raises(Exception, match=r"outside \[0, 1\)"):  # partition 1 of 1
        gpu_check.check_command(bad, cuda=False)


def test_seconds_per_round_is_the_median_of_round_differences(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rounds = [{"round": r, "elapsed_s": t} for r, t in enumerate([40.0, 43.0, 50.0, 52.0], 1)]
    (run / "summary.json").write_text(json.dumps({"status": "completed", "rounds": rounds}))
    # differences 3, 7, 2: the median 3 (the mean would be 4; the first round's 40 s is start)
    assert gpu_check.per_round(run) == (3.0, 4, "completed")
    assert gpu_check.per_round(tmp_path / "none") == (None, 0, "no summary.json")


def test_device_truth_and_gpu_memory_window(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "clients.csv").write_text("round,partition-id,device,gpu_name,gpu_peak_mib\n"
                                     "1,0,cuda:0,H,512.5\n1,1,cuda:0,H,700.0\n1,2,cpu,,\n")
    (run / "fit.csv").write_text("round,partition-id,device,gpu_name,gpu_peak_mib\n"
                                 "1,0,cuda:0,H,812.25\n")
    truth = gpu_check.device_truth(run)
    assert truth["devices"] == {"cuda:0": 2, "cpu": 1} and truth["fit_devices"] == {"cuda:0": 1}
    assert truth["names"] == ["H"] and truth["peak"] == 812.25
    (tmp_path / "smi.csv").write_text("99.5,9000,1\n100.0,1200,3\n101.0,2500,9\n103.0,800,2\n")
    assert gpu_check.smi_window(tmp_path, 100.0, 102.0) == (2500.0, 9)
