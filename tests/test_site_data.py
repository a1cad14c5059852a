"""Per-site data (issue 50: ``data.dataset: site``): each site's own image folder or table
file is its client's data, no pool anywhere; the classes, the input shape and the
normalisation come from the run's declaration; a site that does not fit is refused with the
key; the local split is each site's own."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from flower_pfl import config
from flower_pfl.learning import client_data, own_data, site_data, source_readers
from flower_pfl.learning.data_common import DataError
from flower_pfl.reliability import preflight as pf
from flower_pfl.running import inprocess

CLASSES = ["cat", "dog", "fox"]


def make_site(root, counts, size=16, mode="L", nested=None):
    """``root/<class>/<i>.png``: class ``name``'s image i has every pixel ``10 * k + i``
    (k its index in :data:`CLASSES`); ``nested``: ``{class: n_test}`` puts the last
    ``n_test`` of a class under ``test/`` and the rest under ``train/``."""
    from PIL import Image

    for name, n in counts.items():
        k = CLASSES.index(name) if name in CLASSES else 20
        for i in range(n):
            split = "" if nested is None else ("test" if i >= n - nested[name] else "train")
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            a = np.full((size, size, 3), 10 * k + i, dtype=np.uint8)
            Image.fromarray(a if mode == "RGB" else a[:, :, 0], mode=mode).save(
                folder / f"{i:03d}.png")
    return root


def site_cfg(tmp_path, shape=(1, 16, 16), **more):
    tree = {"rounds": 2, "clients": 3, "fraction-fit": 1.0, "model": "cnn", "seed": 0,
            "cache-dir": str(tmp_path / "cache"),
            "data": {"dataset": "site", "classes": list(CLASSES), "input-shape": list(shape),
                     "normalize": "none", "partition": "iid", "subsample": None},
            "train": {"epochs": 1, "batch-size": 4, "lr": 0.05}}
    return config.validate(config.merge(tree, more), source="test")


def federation(paths):
    """``inprocess.make_federation``'s nodes, each with ``data-root`` its own site's path
    (the node config ``flower-pfl supernode --data PATH`` gives)."""
    from flwr.app import Context, RecordDict
    from flwr.server.client_manager import SimpleClientManager

    manager = SimpleClientManager()
    for pid in reversed(range(len(paths))):
        ctx = Context(run_id=0, node_id=7000 + 3 * pid,
                      node_config={"partition-id": pid, "num-partitions": len(paths),
                                   "data-root": str(paths[pid])},
                      state=RecordDict(), run_config={"client-state-dir": ""})
        manager.register(inprocess.InProcessProxy(str(7000 + 3 * pid), ctx))
    return manager


@pytest.fixture
def fresh(monkeypatch):
    """A process that has read no data: no source info, no client cache."""
    monkeypatch.setattr(own_data, "_INFO", {})
    client_data.clear_cache()
    own_data.clear_cache()


@pytest.fixture
def reads(monkeypatch):
    """The folders the image reader opens, in order."""
    seen = []
    real = source_readers.read_imagefolder

    def spy(path, settings):
        seen.append(path)
        return real(path, settings)

    monkeypatch.setattr(source_readers, "read_imagefolder", spy)
    return seen


# --------------------------------------------------------------------------- a run
def test_three_sites_of_different_classes_train_two_rounds_each_on_its_own(
        tmp_path, fresh, reads):
    sites = [make_site(tmp_path / "s0", {"cat": 6, "dog": 3}),
             make_site(tmp_path / "s1", {"dog": 5, "fox": 7}),
             make_site(tmp_path / "s2", {"fox": 4})]
    cfg = site_cfg(tmp_path, strategy="fedavg")
    pf.preflight(cfg)  # no data anywhere on the server: the declaration is checked
    assert reads == []
    strategy = inprocess.run(cfg, tmp_path / "res", manager=federation(sites))
    assert len(strategy.eval_history) == 2
    assert sorted(reads) == sorted(p.resolve() for p in sites)  # each read its own only
    with open(tmp_path / "res" / "clients.csv") as fh:
        rows = {(r["round"], r["partition-id"]): r for r in csv.DictReader(fh)}
    # 9 samples, T = round(9 * .25) = 2; 12 -> 3; 4 -> 1 (hand-checked in the split test)
    assert {pid: rows[("2", pid)]["num-train"] for pid in "012"} == \
        {"0": "7", "1": "9", "2": "3"}
    client_data.clear_cache()
    got = client_data.load_client_data(cfg.values, 1, str(sites[1]))
    assert set(got.y_train.tolist()) == {1, 2}  # dog, fox: the run's indices, not 0, 1
    assert got.num_classes == 3


def test_table_sites_with_an_mlp_and_a_refused_site_is_a_failed_client(tmp_path, fresh):
    rng = np.random.default_rng(0)
    paths = []
    for pid, labels in enumerate([["cat", "dog"], ["dog", "fox"], ["cat", "owl"]]):
        y = np.array(labels)[rng.integers(0, 2, 16)]
        f1 = np.array([CLASSES.index(v) if v in CLASSES else 9 for v in y], float)
        path = tmp_path / f"site{pid}.csv"
        with open(path, "w") as fh:
            fh.write("f1,f2,kind\n" + "".join(f"{a},{-a},{b}\n" for a, b in zip(f1, y)))
        paths.append(path)
    cfg = site_cfg(tmp_path, shape=(2,), model="dnn", strategy="fedavg",
                   **{"data.features": ["f1", "f2"], "data.label": "kind",
                      "min-fit-answers": 2, "min-eval-answers": 2})
    strategy = inprocess.run(cfg, tmp_path / "res", manager=federation(paths))
    assert len(strategy.eval_history) == 2
    with open(tmp_path / "res" / "clients.csv") as fh:
        answered = {r["partition-id"] for r in csv.DictReader(fh)}
    assert answered == {"0", "1"}  # site 2 holds "owl": it failed, the others trained
    failures = (tmp_path / "res" / "failures.csv").read_text()
    assert "'owl'" in failures and "data.classes" in failures  # the server saw why
    with pytest.raises(site_data.SiteError, match=r"class\(es\) \['owl'\] that are not in "
                                                  r"'data.classes'"):
        client_data.load_host_data(cfg.values, 2, str(paths[2]))


# ------------------------------------------------------------------------ the split
def test_the_stratified_split_of_one_site_by_hand(tmp_path, fresh):
    """cat 5, dog 3, fox 1 (n 9): T = max(1, round(9 * 0.25)) = 2; exact shares 1.11,
    0.67, 0.22 -> floors 1, 0, 0, the one left to dog (largest remainder): test cat 1,
    dog 1, fox 0; the lone fox trains."""
    site = make_site(tmp_path / "s", {"cat": 5, "dog": 3, "fox": 1})
    cfg = site_cfg(tmp_path).values
    got = client_data.load_host_data(cfg, 0, str(site))
    assert np.bincount(got.y_train.numpy(), minlength=3).tolist() == [4, 2, 1]
    assert np.bincount(got.y_test.numpy(), minlength=3).tolist() == [1, 1, 0]
    for seed in range(1, 9):  # per class whatever the shuffle (a random cut: not so)
        again = client_data.load_host_data(site_cfg(tmp_path, seed=seed).values, 0, str(site))
        assert np.bincount(again.y_test.numpy(), minlength=3).tolist() == [1, 1, 0]
    assert not torch.equal(got.x_test, again.x_test)  # another seed, other samples
    other_site = client_data.load_host_data(cfg, 1, str(site))  # same files, partition-id 1
    assert not torch.equal(got.x_test, other_site.x_test)  # seeded by [seed, partition-id]


def test_split_folders_are_the_sites_own_split(tmp_path, fresh):
    site = make_site(tmp_path / "s", {"cat": 4, "fox": 5}, nested={"cat": 1, "fox": 3})
    got = client_data.load_host_data(site_cfg(tmp_path).values, 0, str(site))
    assert np.bincount(got.y_train.numpy(), minlength=3).tolist() == [3, 0, 2]
    assert np.bincount(got.y_test.numpy(), minlength=3).tolist() == [1, 0, 3]
    # fox's test images are i = 2, 3, 4 (pixels 22, 23, 24): exactly those, unnormalised
    fox = got.x_test[got.y_test == 2][:, 0, 0, 0] * 255
    assert sorted(torch.round(fox).tolist()) == [22.0, 23.0, 24.0]


def test_grey_site_in_a_colour_run_and_the_declared_normalisation(tmp_path, fresh):
    site = make_site(tmp_path / "s", {"dog": 3, "fox": 2})  # greyscale
    cfg = site_cfg(tmp_path, shape=(3, 16, 16), **{"data.normalize": [[0.1, 0.2, 0.3],
                                                                      [0.5, 0.25, 2.0]]})
    got = client_data.load_host_data(cfg.values, 0, str(site))
    x = torch.cat([got.x_train, got.x_test])
    y = torch.cat([got.y_train, got.y_test])
    pixel = x[:, :, 0, 0]  # (5, 3): one value per channel per image
    p = pixel[:, 0] * 0.5 + 0.1  # channel 0 undone: the grey value / 255
    assert sorted(torch.round(p * 255).tolist()) == [10, 11, 12, 20, 21]  # dog 0-2, fox 0-1
    assert torch.allclose(pixel[:, 1], (p - 0.2) / 0.25, atol=1e-6)  # R = G = B, each
    assert torch.allclose(pixel[:, 2], (p - 0.3) / 2.0, atol=1e-6)   # with its own mean/std
    assert y.tolist().count(1) == 3 and y.tolist().count(2) == 2


# ---------------------------------------------------------------------- refusals
@pytest.mark.parametrize("change, match", [
    ({"data.classes": None}, r"data.dataset = 'site' .* needs 'data.classes'"),
    ({"data.input-shape": None}, r"needs 'data.input-shape'"),
    ({"data.normalize": "auto"}, r"'data.normalize' = 'auto' .* differ from site to site"),
    ({"data.normalize": [[0.5, 0.5], [1, 1]]}, r"gives 2 mean\(s\) but 'data.input-shape' = "
                                               r"\[1, 16, 16\] has 1 channels"),
    ({"data.image-size": 8}, r"'data.image-size' = 8 does not fit 'data.input-shape'"),
    ({"data.subsample": 100}, r"'data.subsample' = 100 cuts a pooled dataset"),
    ({"data.classes": ["a", "b", "a"]}, r"'data.classes' = .* names a class twice"),
    ({"data.input-shape": [2, 16, 16]}, r"'data.input-shape'.*C 1 or 3"),
])
def test_a_per_site_declaration_is_refused_naming_the_key(tmp_path, change, match):
    with pytest.raises(config.ConfigError, match=match):
        site_cfg(tmp_path, **change)


def test_the_declaration_keys_are_refused_where_nothing_reads_them(tmp_path):
    """data.classes orders a pooled source of your own (issue 67), never a built-in set;
    data.input-shape is read only per site."""
    with pytest.raises(config.ConfigError, match=r"'data.classes' = .* orders your own data's "
                                                 r"classes, not the built-in"):
        site_cfg(tmp_path, **{"data.dataset": "fmnist", "data.input-shape": None,
                              "data.normalize": "auto"})
    with pytest.raises(config.ConfigError, match=r"'data.input-shape' = .* is read only with "
                                                 r"data.dataset = 'site'"):
        site_cfg(tmp_path, **{"data.dataset": "fmnist", "data.classes": None,
                              "data.normalize": "auto"})


@pytest.mark.parametrize("what, match", [
    ("unknown", r"holds class\(es\) \['owl'\] that are not in 'data.classes' = "
                r"\['cat', 'dog', 'fox'\]"),
    ("size", r"holds images of shape \[1, 12, 12\] .* but 'data.input-shape' = \[1, 16, 16\] "
             r"\(data.image-size resizes"),
    ("colour", r"holds images of shape \[3, 16, 16\].*\(a colour site in a greyscale run"),
    ("empty", r"the folder holds no samples"),
    ("features", r"holds 3 features per sample, but 'data.input-shape' = \[2\]"),
    ("header", r"no samples"),
])
def test_a_site_that_does_not_fit_is_refused_on_the_node(tmp_path, fresh, what, match):
    from PIL import Image

    site, shape, more = tmp_path / "s", (1, 16, 16), {}
    if what == "unknown":
        make_site(site, {"cat": 2, "owl": 2})
    elif what == "size":
        make_site(site, {"cat": 3}, size=12)
    elif what == "colour":
        make_site(site, {"cat": 3}, mode="RGB")
        Image.fromarray(np.zeros((16, 16, 3), np.uint8) + np.uint8(9)).save(site / "cat" / "c.png")
    elif what == "empty":
        (site / "cat").mkdir(parents=True)
    else:
        site = tmp_path / "s.csv"
        site.write_text("a,b,c,kind\n" + ("1,2,3,cat\n2,3,4,dog\n" if what == "features"
                                          else ""))
        shape, more = (2,), {"data.features": ["a", "b", "c"], "data.label": "kind"}
    cfg = site_cfg(tmp_path, shape=shape, model="dnn", **more).values
    with pytest.raises(site_data.SiteError, match=match) as err:
        client_data.load_host_data(cfg, 0, str(site))
    assert str(site.resolve()) in str(err.value)  # the path named


def test_a_table_site_without_named_features_is_refused(tmp_path, fresh):
    (tmp_path / "s.csv").write_text("a,kind\n1,cat\n2,dog\n")
    cfg = site_cfg(tmp_path, shape=(1,), model="dnn", **{"data.label": "kind"}).values
    with pytest.raises(site_data.SiteError, match=r"a per-site table needs 'data.features'"):
        client_data.load_host_data(cfg, 0, str(tmp_path / "s.csv"))


def test_preflight_checks_the_model_on_the_declared_shape_only(tmp_path, fresh, reads):
    out = tmp_path / "res" / "initial.npz"
    pf.preflight(site_cfg(tmp_path), initial_out=out)
    assert out.is_file() and reads == []
    with pytest.raises(pf.PreflightError, match=r"model 'cnn' needs images .* dataset 'site' "
                       r"gives samples of 3 features"):
        pf.preflight(site_cfg(tmp_path, shape=(3,)))
    from flower_pfl.learning import shards

    with pytest.raises(DataError, match="no pooled dataset"):
        shards.write_shards(site_cfg(tmp_path).values, tmp_path / "shards")


def test_a_simulation_reads_data_root_per_partition(tmp_path, fresh):
    make_site(tmp_path / "sites" / "0", {"cat": 3, "dog": 3})
    (tmp_path / "sites" / "1.csv").write_text("kind,a\n" + "cat,1\ndog,2\n" * 3)
    values = site_cfg(tmp_path, clients=2, **{"data.root": str(tmp_path / "sites")}).values
    assert client_data.load_host_data(values, 0).num_train == 4
    assert site_data.site_path(values, 1, None) == tmp_path / "sites" / "1.csv"
    with pytest.raises(site_data.SiteError, match="start its SuperNode with --data"):
        site_data.site_path(dict(values, **{"data.root": None}), 0, None)


# ------------------------------------------------------------------- the SuperNode
def _supernode(tmp_path, *extra):
    from flower_pfl.running import sites

    args = sites.supernode_parser().parse_args(
        ["--superlink", "10.0.0.1:9092", "--insecure", "--state-dir", str(tmp_path / "st"),
         "--num-partitions", "3", *extra])
    return sites.supernode_plan(args)


def test_supernode_takes_a_sites_own_file_and_checks_it_against_the_run(tmp_path, fresh):
    import yaml

    from flower_pfl.running.procs import LaunchError

    table = tmp_path / "mine.csv"
    table.write_text("a,b,kind\n" + "1,2,cat\n2,1,dog\n3,3,cat\n4,0,cat\n")
    cmd, _, about = _supernode(tmp_path, "--partition-id", "1", "--data", str(table))
    assert f'data-root="{table}"' in cmd[cmd.index("--node-config") + 1]
    assert "table file" in about
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({
        "clients": 3, "model": "dnn", "data": {
            "dataset": "site", "classes": ["cat", "dog"], "input-shape": [2],
            "normalize": "none", "features": ["a", "b"], "label": "kind",
            "subsample": None}}))
    _, _, about = _supernode(tmp_path, "--partition-id", "1", "--data", str(table),
                             "--config", str(run))
    # 4 samples: T = 1, cat 3 x 1/4 = .75 -> the one test sample is a cat
    assert "3 train + 1 test samples of classes ['cat', 'dog']" in about
    with pytest.raises(LaunchError, match=r"cannot serve this run: .*'data.input-shape' = "
                                          r"\[3\]"):
        _supernode(tmp_path, "--partition-id", "1", "--data", str(table), "--config",
                   str(run), "--set", "data.input-shape=[3]")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LaunchError, match=r"--data .*empty: the folder holds no samples"):
        _supernode(tmp_path, "--partition-id", "0", "--data", str(tmp_path / "empty"))
    with pytest.raises(LaunchError, match=r"no such folder or file"):
        _supernode(tmp_path, "--partition-id", "0", "--data", str(tmp_path / "nowhere"))
