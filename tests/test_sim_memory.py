"""What a simulation's processes hold: the ServerApp and the launcher without torch, the
pooled data mapped once, the clients' images normalised per batch from it, Ray without its
prestarted workers (benchmarks/sim_memory.py measures the sizes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import small_config, tiny_run_yaml

ROOT = Path(__file__).resolve().parent.parent

SERVER_CHILD = """
import json, sys
from flwr.app import Context, RecordDict
from flower_pfl import server_app
ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={
    "config-file": "simulation.yaml", "results-dir": sys.argv[2],
    "overrides": "model=dnn clients=4 data.subsample=2000 strategy=" + sys.argv[1]})
strategy = server_app.server_fn(ctx).server.strategy
strategy.initialize_parameters(None)
import numpy as np
np.savez(sys.argv[3], *strategy.global_arrays)
print(json.dumps({"torch": "torch" in sys.modules}))
"""


def test_the_server_process_never_imports_torch_and_gets_the_same_initial_model(tmp_path):
    """A numpy strategy's ServerApp builds its initial model in a child process: its own
    process has no torch (~280 MB of private memory per process for this CUDA build), and
    the arrays are bit for bit the ones built in-process."""
    from flower_pfl.learning.models import initial_arrays

    out = tmp_path / "arrays.npz"
    done = subprocess.run([sys.executable, "-c", SERVER_CHILD, "fedavg", str(tmp_path / "res"),
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"torch": False}
    want = initial_arrays(small_config(model="dnn", clients=4,
                                       data={"subsample": 2000}).values)
    with np.load(out) as z:
        got = [z[f"arr_{i}"] for i in range(len(z.files))]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_pooled_arrays_are_mapped_read_only_from_one_file(tmp_path):
    """Every process maps the same cached file (page cache, shared) instead of holding a
    private copy; a client's tensors are its own rows only."""
    from flower_pfl.learning import client_data, data

    cache = str(tmp_path / "cache")
    x, y = data.load_pooled("fmnist", None, cache)
    assert isinstance(x, np.memmap) and isinstance(y, np.memmap)
    assert not x.flags.writeable and len(x) == len(y) == 70_000
    data.clear_cache()  # a second process: the same file, no rebuild
    x2, _ = data.load_pooled("fmnist", None, cache)
    assert x2.filename == x.filename and np.array_equal(x2[:50], x[:50])

    cfg = small_config(clients=4, **{"cache-dir": cache})
    client_data.clear_cache()
    d = client_data.load_client_data(cfg.values, 1)
    from flower_pfl.learning.partitions import get_partition

    part = get_partition(cfg.values, np.asarray(y))
    assert d.num_train == len(part.train[1]) and d.num_test == len(part.test[1])
    assert np.array_equal(d.y_train.numpy(), y[part.train[1]])


def test_a_corrupt_pooled_copy_is_rebuilt(tmp_path):
    from flower_pfl.learning import data

    cache = tmp_path / "cache"
    x, _ = data.load_pooled("fmnist", None, str(cache))
    path = Path(x.filename)
    del x
    data.clear_cache()
    path.write_bytes(path.read_bytes()[:1000])  # truncated
    x, y = data.load_pooled("fmnist", None, str(cache))
    assert len(x) == len(y) == 70_000


def test_the_simulation_environment_turns_off_rays_prestarted_workers(tmp_path, monkeypatch):
    """Ray starts one idle Python worker per CPU for the first driver besides the ClientApp
    actors; the simulation's environment turns that off (a user's own value wins)."""
    from flower_pfl.running.launch import simulation_env

    monkeypatch.delenv("RAY_prestart_worker_first_driver", raising=False)
    assert simulation_env(tmp_path, 9092)["RAY_prestart_worker_first_driver"] == "0"
    monkeypatch.setenv("RAY_prestart_worker_first_driver", "1")
    assert simulation_env(tmp_path, 9092)["RAY_prestart_worker_first_driver"] == "1"


LAUNCHER_CHILD = """
import json, sys
from flower_pfl import cli
from flower_pfl.running.procs import LaunchError
seen = {}
def no_federation(*args, **kwargs):  # the preflight has run; stop before the federation
    seen["torch"] = "torch" in sys.modules
    raise LaunchError("stopped by the test")
cli.run_simulation = no_federation
rc = cli.main(["run", "--config", sys.argv[1]])
print(json.dumps({"rc": rc, **seen, "torch_at_end": "torch" in sys.modules}))
"""


def test_the_launcher_checks_the_model_without_importing_torch(tmp_path):
    """``flower-pfl run`` checks the model against the data in a short-lived child: the
    launcher (alive for the whole run) never imports torch, yet the check ran (it made the
    output folder) and the run went on to the federation."""
    path = tiny_run_yaml(tmp_path)
    done = subprocess.run([sys.executable, "-c", LAUNCHER_CHILD, str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"rc": 1, "torch": False, "torch_at_end": False}, done.stderr[-3000:]
    assert (tmp_path / "out" / "run").is_dir()


@pytest.mark.parametrize("change", [
    {"data.root": "/nonexistent/fmnist"},  # the data
    {"clients": 400, "data.subsample": 500},  # the partition
])
def test_a_bad_config_gives_the_same_error_from_the_child(tmp_path, change):
    from flower_pfl.reliability.preflight import PreflightError, preflight
    from flower_pfl.reliability.preflight_apart import preflight_apart

    cfg = small_config(**change)
    with pytest.raises(PreflightError) as here:
        preflight(cfg, tmp_path / "here")
    with pytest.raises(PreflightError) as apart:
        preflight_apart(cfg, tmp_path / "apart")
    assert str(apart.value) == str(here.value)
    preflight_apart(small_config(), tmp_path / "ok")  # a good one passes



def test_a_clients_batches_are_the_old_tensors_bit_for_bit(tmp_path):
    """A client's images are row numbers into the shared pooled map, normalised per batch:
    every batch (training's index batches, evaluation's slices, single rows) is bit for bit
    what normalising the whole client up front gave, and so is a trained model."""
    import torch

    from flower_pfl.learning import client_data, data
    from flower_pfl.learning.models import model_for
    from flower_pfl.learning.partitions import get_partition
    from flower_pfl.learning.training import TrainSpec, batches, evaluate, train

    cfg = small_config(model="dnn", clients=4)
    client_data.clear_cache()
    d = client_data.load_client_data(cfg.values, 2)
    x, y = data.load_pooled("fmnist", None, None)
    part = get_partition(cfg.values, np.asarray(y))
    assert isinstance(d.x_train, data.NormalizedImages) and d.x_train.pooled is x  # no copy
    old_train = data.to_tensor(x[part.train[2]], "fmnist")
    old_test = data.to_tensor(x[part.test[2]], "fmnist")
    assert d.x_train.shape == tuple(old_train.shape) and len(d.x_test) == len(old_test)
    for idx in batches(d.num_train, 10, 2 * d.num_train // 10, torch.Generator().manual_seed(1)):
        got = d.x_train[idx]
        assert got.dtype == torch.float32 and torch.equal(got, old_train[idx])
    for start in range(0, d.num_test, 64):
        assert torch.equal(d.x_test[start:start + 64], old_test[start:start + 64])
    assert torch.equal(d.x_train[5], old_train[5]) and torch.equal(d.x_train[:], old_train)

    spec = TrainSpec(lr=0.05, batch_size=10)
    models = []
    for xs, xt in ((old_train, old_test), (d.x_train, d.x_test)):
        torch.manual_seed(0)
        model = model_for(cfg.values)
        metrics = train(model, xs, d.y_train, spec, torch.Generator().manual_seed(3),
                        torch.device("cpu"))
        models.append((model, metrics, evaluate(model, xt, d.y_test, torch.device("cpu"))))
    (a, ma, ea), (b, mb, eb) = models
    assert ma == mb and ea == eb
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_the_lookup_is_the_normalisation_for_every_byte_and_channel():
    import torch

    from flower_pfl.learning import data

    rng = np.random.default_rng(0)
    for dataset, channels in (("fmnist", 1), ("cifar10", 3)):
        pooled = rng.integers(0, 256, size=(300, channels, 16, 16), dtype=np.uint8)
        pooled[7] = np.arange(256, dtype=np.uint8).reshape(16, 16)  # every byte, each channel
        rows = np.concatenate([[7], rng.permutation(300)[:119]])
        images = data.NormalizedImages(pooled, rows, dataset)
        want = data.to_tensor(pooled[rows], dataset)
        assert torch.equal(images[:], want) and torch.equal(images[0], want[0])
        idx = torch.from_numpy(rng.integers(0, 120, size=40))
        assert torch.equal(images[idx], want[idx])
