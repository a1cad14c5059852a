"""What a simulation's processes hold: the ServerApp without torch, the pooled data mapped
once, Ray without its prestarted workers (benchmarks/sim_memory.py measures the sizes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.conftest import small_config

ROOT = Path(__file__).resolve().parent.parent

SERVER_CHILD = """
import json, sys
from flwr.common import Context, RecordDict
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
    data._POOLED.clear()  # a second process: the same file, no rebuild
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
    data._POOLED.clear()
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
