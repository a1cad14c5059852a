"""Bad input before training: an unwritable output folder, a model that does not fit the
data and a bad command line are named before anything starts; Flower's processes get one
BLAS thread and a start that makes no progress is stopped by the watchdog (the slow tier:
repeated starts of a real run do not hang)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import small_config
from tests.test_reliability import REPO, _tiny_yaml


# ------------------------------------------------------------ bad input before training
def test_unwritable_output_dir_is_named(tmp_path):
    from flower_pfl.reliability.preflight import PreflightError, check_output_dir

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(PreflightError, match=r"output directory .*file/run is not writable"):
        check_output_dir(blocker / "run")


def test_model_not_fitting_the_data_is_named(tmp_path, monkeypatch):
    from flower_pfl.learning import data
    from flower_pfl.reliability.preflight import PreflightError, preflight

    cfg = small_config(model="mclr", **{"data.subsample": 2000})
    preflight(cfg, tmp_path / "ok")  # the real pairing passes
    # a model built for 3x32x32 inputs (what a mislabelled dataset would give)
    monkeypatch.setattr(data, "input_shape", lambda name: (3, 32, 32))
    with pytest.raises(PreflightError, match=r"model 'mclr' does not fit dataset 'fmnist': "
                                             r"samples of shape \(1, 28, 28\) fail"):
        preflight(cfg, tmp_path / "bad")
    monkeypatch.setattr(data, "input_shape", lambda name: (1, 28, 28))
    monkeypatch.setitem(data.NUM_CLASSES, "fmnist", 5)
    with pytest.raises(PreflightError, match=r"gives \(5,\) outputs per sample but dataset "
                                             r"'fmnist' has 10 classes"):
        preflight(cfg, tmp_path / "bad")


def test_cli_refuses_bad_input_before_starting(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    path = _tiny_yaml(tmp_path, "fedavg", **{"output-dir": str(blocker)})
    out = subprocess.run([str(Path(sys.executable).parent / "flower-pfl"), "run", "--config",
                          str(path)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 2 and "cannot start" in out.stderr and "not writable" in out.stderr
    assert "SuperLink" not in out.stdout
    out = subprocess.run([str(Path(sys.executable).parent / "flower-pfl"), "run", "--resume",
                          str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 2 and "no checkpoint there" in out.stderr


def test_flower_processes_get_one_blas_thread_and_the_watchdog_fires(tmp_path):
    from flower_pfl.running.procs import LaunchError, ProcessSet, flwr_env, stream_run

    env = flwr_env(tmp_path / "home", 1)
    assert env["OPENBLAS_NUM_THREADS"] == "1"  # no OpenBLAS thread pool: no exec_blas spin
    # a "run" that prints one progress line and then hangs: stopped with a clear message
    cmd = [sys.executable, "-c", "import time; print('[flower-pfl] started', flush=True); "
           "time.sleep(600)"]
    procs = ProcessSet()
    started = time.time()
    with pytest.raises(LaunchError, match=r"watchdog: no progress for 3s .* the last progress "
                                          r"line was: '\[flower-pfl\] started'"):
        stream_run(cmd, env, tmp_path / "log", False, None, procs, stall_s=3)
    procs.stop()
    assert time.time() - started < 120
    assert all(p.poll() is not None for p in procs.procs)


@pytest.mark.slow  # a real `flwr run`
def test_real_repeated_starts_of_a_model_matrix_run_do_not_hang(tmp_path):
    # issue 15: 1 of 6 identical FedACS starts sat in [INIT] for 10 minutes (BLAS spin).
    from flower_pfl import config
    from flower_pfl.running.launch import run_simulation

    path = _tiny_yaml(tmp_path, "fedacs", clients=40, rounds=1, **{"fraction-fit": 0.1,
                                                                 "stall-timeout": 240,
                                                                 "checkpoint-every": 0})
    cfg = config.load(path)
    for attempt in range(3):
        out = run_simulation(cfg, path, [], tmp_path / f"r{attempt}", echo=False, timeout_s=600)
        assert out.status == "finished:completed"
