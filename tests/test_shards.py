"""Data per site: ``flower-pfl partition`` shards, loaded by a node instead of the pooled set."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from flower_pfl import cli
from flower_pfl.learning import client_data, data, partitions, shards
from flower_pfl.running import inprocess
from tests.conftest import small_config

REPO = Path(__file__).resolve().parents[1]
SMALL = {"clients": 4, "model": "mclr", "data.subsample": 2000}


def _cfg(**changes):
    return small_config(**{**SMALL, **changes})


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The shards of the small configuration, written once for the module."""
    cfg = _cfg()
    out = tmp_path_factory.mktemp("shards")
    manifests = shards.write_shards(cfg.values, out, command="test")
    return cfg, out, manifests


@pytest.fixture
def refuse_pooled(monkeypatch):
    """``refuse_pooled()``: from then on any use of the pooled dataset (or its partition)
    fails loudly and is recorded in the list it returns."""
    calls = []

    def refuse(name):
        def fail(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"data.{name} called while loading a shard")
        return fail

    def arm():
        client_data.clear_cache()
        monkeypatch.setattr(data, "load_pooled", refuse("load_pooled"))
        monkeypatch.setattr(partitions, "get_partition", refuse("get_partition"))
        return calls

    return arm


def _pooled_client_data(cfg, pid):
    client_data.clear_cache()
    return client_data.load_client_data(cfg.values, pid)


def test_shard_equals_the_pooled_split_tensor_for_tensor(made, refuse_pooled):
    cfg, out, manifests = made
    assert sorted(p.name for p in out.iterdir()) == ["0", "1", "2", "3"]
    pooled = [_pooled_client_data(cfg, pid) for pid in range(4)]
    calls = refuse_pooled()
    for pid in range(4):
        got = client_data.load_client_data(cfg.values, pid, str(out / str(pid)))
        want = pooled[pid]
        for name in ("x_train", "y_train", "x_test", "y_test"):
            a, b = getattr(got, name)[:], getattr(want, name)[:]  # pooled images: per batch
            assert a.dtype == b.dtype and torch.equal(a, b), (pid, name)
        assert got.num_classes == want.num_classes == 10
        assert got.task == want.task == "classification"
    assert calls == []


def test_manifest_counts_histograms_and_settings_match_the_data(made):
    cfg, out, manifests = made
    x, y = data.load_pooled("fmnist", None, cfg.values.get("cache-dir"))
    part = partitions.get_partition(cfg.values, y)
    for pid in range(4):
        manifest = json.loads((out / str(pid) / "manifest.json").read_text())
        assert manifest == manifests[pid]
        tr, te = part.train[pid], part.test[pid]
        assert manifest["partition-id"] == pid and manifest["num-partitions"] == 4
        assert manifest["dataset"] == "fmnist"
        assert manifest["counts"] == {"train": len(tr), "test": len(te)}
        assert manifest["label-histogram"]["train"] == np.bincount(y[tr], minlength=10).tolist()
        assert manifest["label-histogram"]["test"] == np.bincount(y[te], minlength=10).tolist()
        assert manifest["settings-hash"] == partitions.partition_key(cfg.values)
        assert manifest["settings"] == {**{k: cfg.values[k] for k in partitions.PARTITION_KEYS},
                                        "data.split": "stratified"}  # not the first value
        with np.load(out / str(pid) / "shard.npz") as z:  # the raw arrays, as pooled
            assert z["x_train"].dtype == np.uint8 and np.array_equal(z["x_train"], x[tr])
            assert np.array_equal(z["y_train"], y[tr]) and np.array_equal(z["y_test"], y[te])
            assert np.array_equal(z["x_test"], x[te])


@pytest.mark.parametrize("key, value", [("seed", 1), ("data.alpha", 0.1)])
def test_a_shard_of_other_settings_is_refused_naming_what_differs(tmp_path, made, refuse_pooled,
                                                                  key, value):
    cfg = made[0]
    other = _cfg(**{key: value})
    shards.write_shards(other.values, tmp_path)
    calls = refuse_pooled()
    with pytest.raises(shards.ShardError) as err:
        client_data.load_client_data(cfg.values, 2, str(tmp_path / "2"))
    msg = str(err.value)
    pkey = partitions.partition_key
    assert pkey(other.values) in msg and pkey(cfg.values) in msg
    assert f"{key}: {json.dumps(value)} vs {json.dumps(cfg.values[key])}" in msg
    others = [k for k in partitions.PARTITION_KEYS if k != key and f"{k}:" in msg]
    assert others == [], msg  # only the setting that differs is listed
    assert "flower-pfl partition --config" in msg and "--out" in msg
    assert calls == []


def test_a_shard_of_another_partition_id_is_refused(made, refuse_pooled):
    cfg, out, _ = made
    calls = refuse_pooled()
    with pytest.raises(shards.ShardError,
                       match=r"holds partition-id 1 but this node is partition-id 2"):
        client_data.load_client_data(cfg.values, 2, str(out / "1"))
    assert calls == []


def test_a_changed_shard_file_is_refused(tmp_path, made, refuse_pooled):
    cfg = made[0]
    shards.write_shards(cfg.values, tmp_path)
    refuse_pooled()
    shard = tmp_path / "0" / "shard.npz"
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated in the copy to the site
    with pytest.raises(shards.ShardError, match=r"does not match the checksum"):
        client_data.load_client_data(cfg.values, 0, str(tmp_path / "0"))


def _accuracies(results: Path) -> dict:
    with open(results / "clients.csv") as fh:
        return {(r["round"], r["partition-id"]): (r["accuracy"], r["loss"], r["num-train"])
                for r in csv.DictReader(fh)}


def _shard_federation(out: Path, num: int):
    """As ``inprocess.make_federation`` (same node ids and order), each node's
    ``data-root`` its own shard folder."""
    from flwr.app import Context, RecordDict
    from flwr.server.client_manager import SimpleClientManager

    manager = SimpleClientManager()
    for pid in reversed(range(num)):
        node_id = 7000 + 3 * pid
        ctx = Context(run_id=0, node_id=node_id,
                      node_config={"partition-id": pid, "num-partitions": num,
                                   "data-root": str(out / str(pid))},
                      state=RecordDict(), run_config={"client-state-dir": ""})
        manager.register(inprocess.InProcessProxy(str(node_id), ctx))
    return manager


def test_a_federation_on_shards_gives_the_pooled_runs_accuracies(tmp_path, made, refuse_pooled):
    cfg = _cfg(strategy="fedavg", rounds=2, **{"fraction-fit": 1.0})
    out = made[1]
    assert partitions.partition_key(cfg.values) == made[2][0]["settings-hash"]
    client_data.clear_cache()
    inprocess.run(cfg, tmp_path / "pooled")
    pooled = _accuracies(tmp_path / "pooled")
    assert len(pooled) == 8  # 4 clients x 2 evaluation rounds

    calls = refuse_pooled()  # clears the in-memory client data too
    strategy = inprocess.run(cfg, tmp_path / "shards", manager=_shard_federation(out, 4))
    assert calls == []
    assert sorted(strategy.proxies) == [0, 1, 2, 3]
    assert _accuracies(tmp_path / "shards") == pooled


def _cli(*args):
    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    return subprocess.run([sys.executable, "-m", "flower_pfl.cli", "partition", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_cli_writes_a_folder_per_client_and_refuses_a_bad_config(tmp_path):
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("clients: 4\nmodel: mclr\nseed: 0\n"
                         "data:\n  dataset: fmnist\n  partition: dirichlet\n  subsample: 2000\n")
    out = tmp_path / "out"
    res = _cli("--config", str(yaml_file), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["0", "1", "2", "3"]
    for pid in range(4):
        manifest = json.loads((out / str(pid) / "manifest.json").read_text())
        assert manifest["partition-id"] == pid and (out / str(pid) / "shard.npz").is_file()
    assert "wrote 4 shards" in res.stdout and res.stdout.count("\nshard ") == 3
    # the hint names the commands the README documents, not Flower's --node-config
    assert (f"Copy {out}/<i> to client machine i and start its SuperNode with `flower-pfl "
            f"supernode ... --partition-id i --data <that folder>`; on one machine: "
            f"`flower-pfl deploy ... --data-root {out}`") in res.stdout
    assert "node-config" not in res.stdout

    yaml_file.write_text("clients: 4\nmodel: mclr\ndata:\n  dataset: fmnist\n  bogus: 3\n")
    res = _cli("--config", str(yaml_file), "--out", str(tmp_path / "bad"))
    assert res.returncode == 2
    assert "data.bogus" in res.stderr and not (tmp_path / "bad").exists()


def test_cli_says_synthetic_gaussian_needs_no_shards(tmp_path, capsys):
    rc = cli.main(["partition", "--config", str(REPO / "simulation.yaml"),
                      "--set", "data.dataset=synthetic-gaussian", "--set", "model=scalar",
                      "--out", str(tmp_path / "out")])
    assert rc == 2
    assert "not needed for data.dataset = synthetic-gaussian" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_synthetic_gaussian_ignores_a_data_root(made):
    cfg = _cfg(**{"data.dataset": "synthetic-gaussian", "model": "scalar"})
    got = client_data.load_client_data(cfg.values, 1, str(made[1] / "1"))
    assert got.task == "gaussian-mean"


# ------------------------------------------------- deployment: the node's shard folder
def _node_config(cmd: list[str]) -> str:
    return cmd[cmd.index("--node-config") + 1]


def test_deploy_data_root_of_shards_gives_each_node_its_own_folder(tmp_path, made):
    """`flower-pfl deploy --data-root <partition --out>`: node i gets <out>/i, not the
    parent (which holds no dataset and would fail, or the pooled data if it did)."""
    from flower_pfl.running.deploy import Deployment

    out = made[1]
    dep = Deployment(tmp_path / "work", 4, None, data_root=str(out))
    for pid in range(4):
        cmd, _ = dep.node_command(dep.add_node(pid))
        assert f'data-root="{out / str(pid)}"' in _node_config(cmd)
    plain = tmp_path / "fmnist"  # a dataset folder: every node reads it
    plain.mkdir()
    dep = Deployment(tmp_path / "work2", 4, None, data_root=str(plain))
    cmd, _ = dep.node_command(dep.add_node(3))
    assert f'data-root="{plain}"' in _node_config(cmd)


def _supernode_args(*extra: str):
    from flower_pfl.running import sites

    return sites.supernode_parser().parse_args(
        ["--superlink", "10.0.0.1:9092", "--ca", "certs/ca.crt", "--key", "keys/c.key",
         "--state-dir", "state", *extra])


def test_supernode_takes_its_shard_with_relative_paths_and_checks_its_identity(
        tmp_path, made, monkeypatch):
    from flower_pfl.running.certs import make_ca, make_node_key
    from flower_pfl.running.procs import LaunchError
    from flower_pfl.running.sites import supernode_plan

    monkeypatch.chdir(tmp_path)
    make_ca("certs")
    make_node_key("keys", "c")
    shutil.copytree(made[1] / "1", "data")  # this machine holds only shard 1
    cmd, _, about = supernode_plan(_supernode_args("--partition-id", "1", "--data", "data"))
    # num-partitions from the manifest; every path absolute (Flower keeps them as typed)
    assert _node_config(cmd) == (f'partition-id=1 num-partitions=4 state-dir="{tmp_path}/state" '
                                 f'data-root="{tmp_path}/data"')
    assert cmd[cmd.index("--root-certificates") + 1] == str(tmp_path / "certs" / "ca.crt")
    assert cmd[cmd.index("--auth-supernode-private-key") + 1] == str(tmp_path / "keys" / "c.key")
    assert cmd[cmd.index("--superlink") + 1] == "10.0.0.1:9092"
    assert "partition-id 1 of 4" in about and made[2][1]["settings-hash"] in about
    with pytest.raises(LaunchError, match="holds the shard of partition-id 1, not "
                                          "--partition-id 2"):
        supernode_plan(_supernode_args("--partition-id", "2", "--data", "data"))
    with pytest.raises(LaunchError, match="--num-partitions 5 but the shard .* one of 4"):
        supernode_plan(_supernode_args("--partition-id", "1", "--data", "data",
                                       "--num-partitions", "5"))
    with pytest.raises(LaunchError, match="--num-partitions N is needed"):
        supernode_plan(_supernode_args("--partition-id", "1"))  # no shard: say how many
