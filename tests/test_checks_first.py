"""Every setting this machine can judge is judged before anything starts (issue 53, kind 2).

``device: cuda`` and ``client-resources.num-gpus`` on a machine without CUDA used to pass
``validate``, start Ray and fail 43-60 s later in hundreds of lines ("ActorPool is empty").
Now ``validate``, ``run`` and ``bench`` refuse them first -- no SuperLink, no Ray, no
results folder -- with one line that names the key (flower_pfl/reliability/preflight.py).
CUDA is made absent for real where a GPU exists: ``CUDA_VISIBLE_DEVICES=""`` for the
preflight child, ``torch.cuda.is_available`` patched in this process.
"""

from __future__ import annotations

import os

import pytest
import torch
import yaml

from flower_pfl import cli, config, matrix
from flower_pfl.learning import data, devices
from flower_pfl.reliability import preflight as pf
from flower_pfl.reliability.preflight import Machine, PreflightError
from flower_pfl.reliability.preflight_apart import preflight_apart
from flower_pfl.running import bench, launch, procs, rayhead
from tests.conftest import small_config

NO_GPU = Machine(cpus=2, gpus=0, why_no_gpu="torch finds no CUDA device")


@pytest.fixture
def nothing_starts(monkeypatch):
    """Any SuperLink, Ray head or child process of a run fails the test."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a process was started although the run was refused")

    monkeypatch.setattr(cli, "run_simulation", forbidden)
    monkeypatch.setattr(launch, "simulation_superlink", forbidden)
    monkeypatch.setattr(bench, "simulation_superlink", forbidden)
    monkeypatch.setattr(bench, "run_simulation", forbidden)
    monkeypatch.setattr(bench, "shared_ray", forbidden)
    monkeypatch.setattr(rayhead, "shared_ray", forbidden)
    monkeypatch.setattr(procs.ProcessSet, "start", forbidden)


@pytest.fixture
def no_cuda(monkeypatch):
    """No CUDA device here nor in a child, also on a GPU machine."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


# ------------------------------------------------------------------- by hand (pure)
def test_machine_problems_by_hand():
    v = small_config(device="cuda", **{"client-resources.num-gpus": 0.5}).values
    lines = pf.machine_problems(v, NO_GPU, "simulation")
    assert [line.split(":")[0] for line in lines] == ["'device' = 'cuda'",
                                                     "'client-resources.num-gpus' = 0.5"]
    assert "ActorPool is empty" in lines[1] and "set it to 0" in lines[1]
    assert pf.machine_problems(v, NO_GPU, "deployment") == lines[:1]  # no Ray resources
    assert pf.machine_problems(v, NO_GPU, "cluster") == []  # a worker may have the GPU
    assert pf.machine_problems(v, NO_GPU, "remote") == []
    one_gpu = Machine(cpus=2, gpus=1)
    assert pf.machine_problems(v, one_gpu, "simulation") == []
    v = small_config(**{"client-resources.num-gpus": 1}).values
    assert pf.machine_problems(v, one_gpu, "simulation") == []  # a whole GPU each: fits
    v = small_config(**{"client-resources.num-gpus": 1.5, "client-resources.num-cpus": 3}).values
    assert pf.machine_problems(v, one_gpu, "simulation") == [
        "'client-resources.num-gpus' = 1.5 exceeds this machine's 1 GPU(s), so Ray can place "
        "no client; set at most 1",
        "'client-resources.num-cpus' = 3 exceeds this machine's 2 CPU core(s), so Ray can "
        "place no client; set at most 2"]
    v = small_config(**{"client-resources.num-cpus": 2}).values
    assert pf.machine_problems(v, one_gpu, "simulation") == []
    assert not pf.needs_cuda(small_config().values)  # device auto, no GPU share: no probe
    assert pf.needs_cuda(small_config(device="cuda").values, "deployment")
    assert not pf.needs_cuda(small_config(device="cuda").values, "remote")


def test_size_problems_name_data_subsample():
    (line,) = pf.size_problems(config.load(config.APP_DIR / "simulation.yaml",
                                           ["data.subsample=50"]).values)
    assert line.startswith("'data.subsample' = 50 cannot give 20 clients 'data.min-samples' "
                           "= 10 each (Dirichlet): 200 samples needed")
    (line,) = pf.size_problems(small_config(clients=10, **{"data.partition": "iid",
                                                           "data.subsample": 19}).values)
    assert line == ("'data.subsample' = 19 cannot give 10 clients a train and a test sample "
                    "each: 20 samples needed; raise data.subsample to at least 20 or lower "
                    "'clients'")
    assert pf.size_problems(small_config(clients=10, **{"data.partition": "iid",
                                                        "data.subsample": 20}).values) == []
    assert pf.size_problems(small_config(clients=10, **{"data.subsample": 100}).values) == []
    # a partition file lists each client's rows (overlapping ones allowed): 40,000 clients
    # of FMNIST's 70,000 images is not refused by a count of distinct samples
    assert pf.size_problems(small_config(clients=40_000, **{
        "data.partition": "file", "data.partition-file": "parts.json",
        "data.subsample": None}).values) == []
    assert len(pf.size_problems(small_config(clients=40_000, **{
        "data.partition": "iid", "data.subsample": None}).values)) == 1
    (line,) = pf.size_problems(small_config(clients=8000, **{"data.subsample": None}).values)
    assert line == ("'clients' = 8000 (fmnist has 70000 samples) cannot give 8000 clients "
                    "'data.min-samples' = 10 each (Dirichlet): 80000 samples needed; lower "
                    "'clients' or 'data.min-samples'")


# --------------------------------------------------------------- CUDA absent, for real
def test_cuda_devices_says_why_there_is_none(no_cuda):
    count, why = devices.cuda_devices()
    assert count == 0 and ("CUDA_VISIBLE_DEVICES=''" in why or "without CUDA" in why)
    assert pf.this_machine() == Machine(pf.this_machine(False).cpus, 0, why)


@pytest.mark.parametrize("key, value", [("device", "cuda"),
                                        ("client-resources.num-gpus", 0.5)])
def test_preflight_refuses_before_the_data_and_makes_no_folder(tmp_path, monkeypatch, no_cuda,
                                                               key, value):
    def no_data(*a, **k):
        raise AssertionError("the data was loaded although the machine cannot run it")

    monkeypatch.setattr(data, "load_pooled", no_data)
    with pytest.raises(PreflightError) as err:
        pf.preflight(small_config(**{key: value}), tmp_path / "res", tmp_path / "res" / "m.npz")
    assert "\n" not in str(err.value) and str(err.value).startswith(f"'{key}' = {value!r}")
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("key, value", [("device", "cuda"),
                                        ("client-resources.num-gpus", 0.5),
                                        ("client-resources.num-cpus", (os.cpu_count() or 1) + 1),
                                        ("data.subsample", 50)])
def test_run_refuses_before_any_process_or_folder(tmp_path, capsys, nothing_starts, no_cuda,
                                                  key, value):
    out = tmp_path / "outputs"
    rc = cli.main(["run", "--set", f"{key}={value}", "--set", f"output-dir={out}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith(f"flower-pfl: cannot start: '{key}' = {value!r}") and "\n" not in err
    assert not out.exists()  # no results folder


@pytest.mark.parametrize("key, value", [("device", "cuda"),
                                        ("client-resources.num-gpus", 0.5)])
def test_validate_refuses_what_run_would_refuse(tmp_path, capsys, nothing_starts, no_cuda,
                                                key, value):
    out = tmp_path / "outputs"
    rc = cli.main(["validate", "--set", f"{key}={value}", "--set", f"output-dir={out}"])
    captured = capsys.readouterr()
    assert rc == 2 and "OK" not in captured.out
    # the reason first (issue 67: not after a long echo), then the --set as given
    assert captured.err.startswith(f"flower-pfl: cannot start: '{key}' = {value!r}")
    assert f"--set {key}={value} --set output-dir={out}, passes validation)" in captured.err
    assert not out.exists()


def test_bench_refuses_every_cell_before_starting(tmp_path, nothing_starts, no_cuda):
    spec = {"name": "gpu", "set": {"rounds": 1, "clients": 4, "model": "mclr", "device": "cuda",
                                   "data": {"subsample": 2000}},
            "strategies": ["fedavg", "fedprox"], "settings": {"s": {}}, "seeds": [0, 1]}
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    with pytest.raises(PreflightError) as err:
        bench.run_bench(matrix.load_matrix(path), out, log=lambda *a, **k: None)
    (line,) = str(err.value).splitlines()  # one problem, the four cells named with it
    assert line.startswith("'device' = 'cuda'")
    assert line.endswith("[cell(s) s/fedavg/seed-0, s/fedavg/seed-1, s/fedprox/seed-0 and "
                         "1 more]")
    assert not out.exists()


# ------------------------------------------------------------------- folders
def test_folders_are_judged_without_creating_them(tmp_path):
    pf.check_output_dir(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    values = small_config(**{"tracking": "tensorboard", "tracking-dir": str(blocker / "tb"),
                             "cache-dir": str(blocker / "cache")}).values
    lines = pf.path_problems(values, blocker / "run")
    assert [line.split(" ")[0] for line in lines] == ["the", "'tracking-dir'", "'cache-dir'"]
    assert all(f"{blocker} is a file, not a folder" in line for line in lines)
    assert pf.path_problems(small_config(**{"cache-dir": str(tmp_path / "c")}).values,
                            tmp_path / "r") == []


def test_a_refusal_at_the_data_leaves_no_results_folder(tmp_path):
    cfg = small_config(**{"data.root": str(tmp_path / "missing")})
    with pytest.raises(PreflightError, match=r"data.root = .*missing is not a directory"):
        pf.preflight(cfg, tmp_path / "res", tmp_path / "res" / "initial.npz")
    assert not (tmp_path / "res").exists()
    pf.preflight(small_config(model="mclr"), tmp_path / "res", tmp_path / "res" / "initial.npz")
    assert (tmp_path / "res" / "initial.npz").is_file()  # made once every check passed


def test_resume_of_a_missing_folder_says_so(tmp_path):
    with pytest.raises(config.ConfigError, match=r"--resume .*nowhere: no such folder"):
        launch.resume_config(tmp_path / "nowhere")


# ---------------------------------------------------------- where the clients run
def test_a_ray_cluster_or_a_remote_superlink_is_not_judged_by_this_machine(tmp_path,
                                                                          monkeypatch, no_cuda):
    cfg = small_config(model="mclr", device="cuda", **{"client-resources.num-gpus": 1})
    assert pf.start_problems(cfg.values, "cluster", tmp_path / "r", NO_GPU) == []
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # run joins a cluster: its default
    preflight_apart(cfg, tmp_path / "r")  # the data and the model still checked here
    monkeypatch.delenv("RAY_ADDRESS")
    with pytest.raises(PreflightError, match=r"^2 settings cannot work here:\n  - 'device' = "
                                             r"'cuda': .*\n  - 'client-resources.num-gpus' = 1:"):
        preflight_apart(cfg, tmp_path / "r")
    # submit: the SuperLink's folders and the nodes' devices are not this machine's; the
    # data sizes are the same everywhere
    blocker = tmp_path / "file"
    blocker.write_text("x")
    values = small_config(device="cuda", **{"cache-dir": str(blocker / "c"),
                                            "data.subsample": 15}).values
    assert pf.start_problems(values, "remote", blocker / "r", NO_GPU) == pf.size_problems(values)
    assert len(pf.size_problems(values)) == 1


def test_tensorboard_missing_is_named_before_start(monkeypatch):
    import importlib.util

    values = small_config(tracking="tensorboard").values
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    (line,) = pf.start_problems(values, "simulation", None, NO_GPU)
    assert line.startswith("'tracking' = 'tensorboard': the TensorBoard package is not installed")
    assert pf.start_problems(values, "remote", None, NO_GPU) == []  # the SuperLink's machine
    assert pf.tracking_problems(small_config().values) == []


def test_a_run_name_that_holds_a_run_is_refused_and_unnamed_runs_never_share_a_folder(
        tmp_path, capsys, nothing_starts, monkeypatch):
    # two runs' rows appended to one rounds.csv would be a record of neither
    from flower_pfl import config as config_mod
    from flower_pfl.reporting.run_dirs import new_results_dir

    out = tmp_path / "out"
    (out / "mine").mkdir(parents=True)
    (out / "mine" / "summary.json").write_text('{"status": "completed"}')
    for command in ("run", "validate"):
        rc = cli.main([command, "--set", "run-name=mine", "--set", f"output-dir={out}"])
        err = capsys.readouterr().err
        assert rc == 2 and "'run-name' = mine" in err and "holds a run already" in err
    assert sorted(p.name for p in (out / "mine").iterdir()) == ["summary.json"]
    # a named folder without a run (e.g. made by hand) is used as it is
    cfg = config_mod.load(config_mod.APP_DIR / "simulation.yaml",
                          [f"output-dir={out}", "run-name=empty"])
    assert new_results_dir(cfg) == out / "empty"
    # unnamed: the second run in the same second gets -2, the third -3
    import flower_pfl.reporting.results as results_mod

    monkeypatch.setattr(results_mod.time, "strftime", lambda fmt: "20261129-090000")
    cfg = config_mod.load(config_mod.APP_DIR / "simulation.yaml", [f"output-dir={out}"])
    names = []
    for _ in range(3):
        path = new_results_dir(cfg)
        path.mkdir()
        names.append(path.name)
    assert names == ["fedavg-fmnist-dirichlet-20261129-090000",
                     "fedavg-fmnist-dirichlet-20261129-090000-2",
                     "fedavg-fmnist-dirichlet-20261129-090000-3"]
