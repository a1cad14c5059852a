"""flower_pfl.initial_model: the preflight child writes the run's initial model, the ServerApp
reads it instead of importing torch in a child of its own.

The launcher's preflight (in its child process, as ``flower-pfl run`` calls it) writes the
file; a ServerApp given the same configuration through the run config (as JSON, the way
the launcher hands it over) gets the arrays bit for bit ``initial_arrays`` and starts no
child; another configuration, no file or a damaged file: the child builds them as before."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from flower_pfl import initial_model, server_app
from flower_pfl.config import RunConfig
from flower_pfl.learning.models import initial_arrays
from flower_pfl.reliability.preflight_apart import preflight_apart
from tests.conftest import small_config


def _same(got, want) -> bool:
    return len(got) == len(want) and all(a.dtype == b.dtype and np.array_equal(a, b)
                                         for a, b in zip(got, want))


def _context(cfg: RunConfig, path, results) -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={
        "cfg": cfg.to_json(), "initial-arrays": str(path), "results-dir": str(results)})


def _initial(strategy) -> list[np.ndarray]:
    strategy.initialize_parameters(None)
    return strategy.global_arrays


@pytest.fixture
def no_child(monkeypatch):
    """The ServerApp's own child process, replaced by one that records being asked."""
    asked = []

    def child(values):
        asked.append(dict(values))
        return initial_arrays(values)

    monkeypatch.setattr(server_app, "initial_arrays_apart", child)
    return asked


def test_the_preflight_child_writes_what_the_server_app_reads(tmp_path, no_child):
    cfg = small_config(model="dnn", clients=4, data={"subsample": 2000})
    path = tmp_path / "res" / initial_model.FILE
    preflight_apart(cfg, tmp_path / "res", initial_out=path)  # as flower-pfl run calls it
    assert path.is_file()
    _, strategy = server_app.build_strategy(_context(cfg, path, tmp_path / "server"))
    assert no_child == []  # the ServerApp started no child: it read the file
    assert _same(_initial(strategy), initial_arrays(cfg.values))


def test_another_configuration_no_file_or_a_damaged_one_builds_it_as_before(tmp_path,
                                                                            no_child):
    cfg = small_config(model="dnn", clients=4, data={"subsample": 2000})
    path = tmp_path / initial_model.FILE
    initial_model.write(path, cfg.values)
    other = small_config(model="dnn", clients=4, data={"subsample": 2000}, seed=7)
    assert initial_model.read(path, other.values) is None
    _, strategy = server_app.build_strategy(_context(other, path, tmp_path / "server"))
    assert len(no_child) == 1 and no_child[0]["seed"] == 7  # built in the child instead
    assert _same(_initial(strategy), initial_arrays(other.values))
    assert not _same(initial_model.read(path, cfg.values), initial_arrays(other.values))
    assert initial_model.read(tmp_path / "missing.npz", cfg.values) is None
    assert initial_model.read(None, cfg.values) is None
    path.write_bytes(b"not an npz file")
    assert initial_model.read(path, cfg.values) is None


def test_the_file_holds_the_arrays_and_their_configuration(tmp_path):
    cfg = small_config(model="cnn", clients=3)
    path = tmp_path / initial_model.FILE
    initial_model.write(path, cfg.values)
    with np.load(path) as z:
        assert str(z[initial_model.CONFIG_KEY]) == initial_model.fingerprint(cfg.values)
    assert _same(initial_model.read(path, cfg.values), initial_arrays(cfg.values))
    assert not list(tmp_path.glob(".*.tmp"))  # written whole, no temporary left
