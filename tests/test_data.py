"""Partitions on real Fashion-MNIST: each one's label distribution is what it claims."""

from __future__ import annotations

import hashlib
import json
import warnings

import numpy as np
import pytest

from flower_pfl import config, matrix
from flower_pfl.learning import client_data, data, partitions
from flower_pfl.reporting.log_lines import translate_warning
from tests.conftest import small_config


@pytest.fixture(scope="module")
def labels():
    x, y = data.load_pooled("fmnist")
    assert x.shape == (70000, 1, 28, 28) and x.dtype == np.uint8
    assert np.bincount(y).tolist() == [7000] * 10  # the real FMNIST: 7k per class
    return y


def _client_labels(part, y, i):
    return y[np.concatenate([part.train[i], part.test[i]])]


def _check_disjoint(part, n_pool):
    every = np.concatenate(part.train + part.test)
    assert len(np.unique(every)) == len(every), "a sample is held by two clients/splits"
    assert every.max() < n_pool


def test_pathological_has_exactly_k_classes(labels):
    for k in (2, 3):
        cfg = small_config(**{"clients": 20, "data.partition": "pathological",
                              "data.classes-per-client": k, "data.subsample": 20000}).values
        part = partitions.make_partition(labels, cfg)
        for i in range(20):
            assert len(np.unique(labels[part.train[i]])) == k
            assert set(labels[part.test[i]]) <= set(labels[part.train[i]])
        _check_disjoint(part, len(labels))


def test_practical_groups_hold_dominant_share(labels):
    for share in (0.8, 0.6):
        cfg = small_config(**{"clients": 12, "data.partition": "practical", "data.groups": 3,
                              "data.dominant-share": share, "data.subsample": 30000}).values
        part = partitions.make_partition(labels, cfg)
        groups = partitions.group_of_clients(12, 3)
        dominant = np.array_split(np.arange(10), 3)
        sizes = {}
        for i in range(12):
            lab = _client_labels(part, labels, i)
            in_dom = np.isin(lab, dominant[groups[i]]).mean()
            assert abs(in_dom - share) <= 1.0 / len(lab) + 1e-9, (i, in_dom)
            assert len(np.unique(lab)) == 10  # every client sees all classes
            sizes.setdefault(groups[i], set()).add(len(lab))
        # group-specific sample counts, decreasing with the group index (FedAMP sec. 7)
        assert max(sizes[0]) > max(sizes[1]) > max(sizes[2])
        _check_disjoint(part, len(labels))


def test_cap_on_train_samples(labels):
    cfg = small_config(**{"clients": 10, "data.max-train-samples": 50}).values
    part = partitions.make_partition(labels, cfg)
    assert all(len(t) == 50 for t in part.train)
    assert all(len(t) > 0 for t in part.test)


def test_iid_vs_dirichlet_label_skew(labels):
    def mean_tv(partition):
        cfg = small_config(**{"clients": 20, "data.partition": partition, "data.alpha": 0.1,
                              "data.subsample": 20000}).values
        part = partitions.make_partition(labels, cfg)
        tvs = []
        for i in range(20):
            hist = np.bincount(_client_labels(part, labels, i), minlength=10) / \
                len(_client_labels(part, labels, i))
            tvs.append(0.5 * np.abs(hist - 0.1).sum())
        return np.mean(tvs)

    assert mean_tv("iid") < 0.1
    assert mean_tv("dirichlet") > 0.5


def test_same_seed_same_partition_other_seed_differs(labels):
    cfg = small_config(**{"data.partition": "dirichlet"}).values
    a, b = partitions.make_partition(labels, cfg), partitions.make_partition(labels, cfg)
    assert all(np.array_equal(x, y) for x, y in zip(a.train + a.test, b.train + b.test))
    c = partitions.make_partition(labels, small_config(**{"seed": 1}).values)
    assert not all(np.array_equal(x, y) for x, y in zip(a.train, c.train))


def test_partition_cache_round_trip(labels):
    cfg = small_config(**{"data.partition": "iid", "seed": 5}).values
    first = partitions.get_partition(cfg, labels)
    partitions.clear_cache()  # force the disk copy
    second = partitions.get_partition(cfg, labels)
    assert all(np.array_equal(x, y) for x, y in zip(first.train + first.test,
                                                   second.train + second.test))


def test_client_data_tensors(labels):
    cfg = small_config().values
    cd = client_data.load_client_data(cfg, 3)
    part = partitions.get_partition(cfg, labels)
    assert cd.num_train == len(part.train[3]) and cd.num_test == len(part.test[3])
    assert tuple(cd.x_train.shape[1:]) == (1, 28, 28)
    assert abs(float(cd.x_train[:].mean())) < 1.0  # normalised
    with pytest.raises(data.DataError, match="outside"):
        client_data.load_client_data(cfg, 99)


def test_offline_dataset_error_is_clear(tmp_path, monkeypatch):
    # CIFAR-10 is not on this machine and there is no internet in CI: the error says why.
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    with pytest.raises(data.DataError, match="could not load dataset 'cifar10'"):
        data.load_pooled("cifar10", root=str(tmp_path))


def _fresh(tmp_path, **changes):
    return small_config(**{"cache-dir": str(tmp_path / "cache"), **changes})


def test_missing_dataset_folder_is_named(tmp_path):
    with pytest.raises(data.DataError, match=r"data.root = .*nowhere is not a directory"):
        data.load_pooled("fmnist", root=str(tmp_path / "nowhere"), cache_dir=str(tmp_path))


def test_a_data_root_without_the_files_is_not_replaced_by_the_debian_copy(tmp_path,
                                                                          monkeypatch):
    """A node's data-root that holds no IDX files (e.g. the shards' parent folder instead
    of its own shard) goes to torchvision's loader for THAT folder (offline: a clear
    error), never silently to the Debian package's full copy."""
    asked = []

    def no_network(cls, root, dataset):
        asked.append(root)
        raise data.DataError(f"could not load dataset '{dataset}' (offline)")

    monkeypatch.setattr(data, "_download", no_network)
    (tmp_path / "empty").mkdir()
    with pytest.raises(data.DataError, match="could not load dataset 'fmnist'"):
        data.load_pooled("fmnist", root=str(tmp_path / "empty"), cache_dir=str(tmp_path))
    assert asked == [tmp_path / "empty"]


def test_corrupt_dataset_file_is_named(tmp_path):
    import shutil

    root = tmp_path / "fmnist"
    root.mkdir()
    for name in data.FMNIST_FILES:
        shutil.copy(data.DEBIAN_FMNIST_DIR / f"{name}.gz", root / f"{name}.gz")
    blob = (root / "train-images-idx3-ubyte.gz").read_bytes()
    (root / "train-images-idx3-ubyte.gz").write_bytes(blob[: len(blob) // 3])  # truncated
    with pytest.raises(data.DataError, match=r"train-images-idx3-ubyte.gz is corrupt"):
        data.load_pooled("fmnist", root=str(root), cache_dir=str(tmp_path / "cache"))


def test_partition_leaving_a_client_without_data_is_named(labels):
    cfg = small_config(clients=10, **{"data.partition": "iid", "data.subsample": 15})
    with pytest.raises(data.DataError, match=r"client \d+ received 1 samples"):
        partitions.make_partition(labels, cfg.values)
    cfg = small_config(clients=10, **{"data.partition": "iid", "data.subsample": 20,
                                      "data.max-train-samples": 1})
    part = partitions.make_partition(labels, cfg.values)  # 2 samples each: 1 train, 1 test
    assert all(len(t) == 1 for t in part.train) and all(len(t) == 1 for t in part.test)


def test_a_data_root_with_another_copy_is_read_not_the_cached_default(tmp_path):
    """A data.root holding a subset of FMNIST must give that subset, also when a run from
    the Debian copy has already unpacked its files into the same cache (they used to share
    one unpacked folder, so the root's own files were never read)."""
    import gzip
    import struct

    root = tmp_path / "subset"
    root.mkdir()
    for kind, n in (("train", 300), ("t10k", 100)):
        with gzip.open(data.DEBIAN_FMNIST_DIR / f"{kind}-images-idx3-ubyte.gz") as fh:
            head = fh.read(16)
            magic, _, rows, cols = struct.unpack(">IIII", head)
            body = fh.read(n * rows * cols)
        with gzip.open(root / f"{kind}-images-idx3-ubyte.gz", "wb") as fh:
            fh.write(struct.pack(">IIII", magic, n, rows, cols) + body)
        with gzip.open(data.DEBIAN_FMNIST_DIR / f"{kind}-labels-idx1-ubyte.gz") as fh:
            magic, _ = struct.unpack(">II", fh.read(8))
            labels = fh.read(n)
        with gzip.open(root / f"{kind}-labels-idx1-ubyte.gz", "wb") as fh:
            fh.write(struct.pack(">II", magic, n) + labels)
    cache = str(tmp_path / "cache")
    x_full, _ = data.load_pooled("fmnist", root=None, cache_dir=cache)
    x_sub, y_sub = data.load_pooled("fmnist", root=str(root), cache_dir=cache)
    assert len(x_full) == 70000 and len(x_sub) == len(y_sub) == 400
    assert (x_sub[:300] == x_full[:300]).all()  # the same images, in the same order


# ------------------------------------------------ pathological: every class where possible
def _pathological(clients, k, **more):
    return small_config(clients=clients, **{"data.partition": "pathological",
                                            "data.classes-per-client": k, **more}).values


def _unused_note(labels, cfg):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        part = partitions.make_partition(labels, cfg)
    notes = [translate_warning(str(w.message)) for w in caught if "NOT be used" in str(w.message)]
    return part, notes


def test_pathological_6x2_covers_all_10_classes(labels):
    """6 clients x 2 classes >= 10 classes: flwr-datasets' rule (client i: i, i+1) left 7-9
    to nobody; by hand, client i holds 2i, 2i+1 (mod 10)."""
    hand = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [0, 1]]
    assert partitions.pathological_classes(6, 2, 10) == hand
    cfg = _pathological(6, 2)
    part, notes = _unused_note(labels, cfg)
    assert notes == []  # no class left out, so no note
    held = [sorted(set(_client_labels(part, labels, i).tolist())) for i in range(6)]
    assert held == hand
    _check_disjoint(part, len(labels))
    # class 2 wholly with client 1; class 0 halved between clients 0 and 5 (array_split)
    pool = np.concatenate(part.train + part.test)
    in_pool = np.bincount(labels[pool], minlength=10)
    assert (_client_labels(part, labels, 1) == 2).sum() == in_pool[2]
    c0, c5 = ((_client_labels(part, labels, i) == 0).sum() for i in (0, 5))
    assert c0 + c5 == in_pool[0] and abs(int(c0) - int(c5)) <= 1
    again = partitions.make_partition(labels, cfg)  # deterministic in the seed
    assert all(np.array_equal(a, b) for a, b in zip(part.train + part.test,
                                                    again.train + again.test))
    other = partitions.make_partition(labels, dict(cfg, seed=1))
    assert [sorted(set(_client_labels(other, labels, i).tolist())) for i in range(6)] == hand
    assert not np.array_equal(other.train[0], part.train[0])


def test_pathological_keeps_flwr_datasets_rule_where_it_covered(labels, monkeypatch):
    """Where client i: i..i+k-1 already covered every class (clients + k - 1 >= 10: every
    built-in config) the assignment, the partition and its cache key are unchanged."""
    for n, k in ((100, 2), (50, 2), (20, 3), (9, 2), (4, 2), (3, 3)):
        assert partitions.pathological_classes(n, k, 10) == [[(i + j) % 10 for j in range(k)]
                                                               for i in range(n)], (n, k)
    cfg = _pathological(20, 3, **{"data.subsample": 10000})  # PLGU's configs/ setting
    ours = partitions.make_partition(labels, cfg)
    from flwr_datasets.partitioner import PathologicalPartitioner

    monkeypatch.setattr(partitions, "_pathological_partitioner", lambda n, k, seed:
                        PathologicalPartitioner(num_partitions=n, partition_by="label",
                                                num_classes_per_partition=k,
                                                class_assignment_mode="deterministic",
                                                seed=seed))
    theirs = partitions.make_partition(labels, cfg)
    assert all(np.array_equal(a, b) for a, b in zip(ours.train + ours.test,
                                                    theirs.train + theirs.test))

    def old_key(values):
        blob = json.dumps({k: values[k] for k in partitions.PARTITION_KEYS}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    random = dict(cfg, **{"data.split": "random"})  # the split those keys were made with
    assert partitions.partition_key(random) == old_key(random)
    assert partitions.partition_key(cfg) != old_key(cfg)  # stratified: a new partition
    six = dict(_pathological(6, 2), **{"data.split": "random"})
    assert partitions.partition_key(six) != old_key(six)


def test_no_shipped_config_or_matrix_changes_its_pathological_partition(tmp_path):
    root = config.APP_DIR
    trees = [config.load(p).values for p in sorted((root / "configs").glob("*.yaml"))]
    for path in sorted((root / "benchmarks").glob("*.yaml")):
        trees += [config.validate(c.tree, c.key).values
                  for c in matrix.load_matrix(path).cells(tmp_path) if c.tree is not None]
    patho = [v for v in trees if v["data.partition"] == "pathological"]
    assert len(patho) >= 10  # FedACS, PLGU, pFedBreD configs, FedAMP Table 2, pFedBreD Table 1
    assert not [v for v in patho if partitions.covering_changed(v, 10)]


def test_the_note_of_a_truly_impossible_pathological_case_names_its_cause(labels):
    _, notes = _unused_note(labels, _pathological(4, 2))  # 4 x 2 = 8 < 10 classes
    assert notes == ["note: the pathological partition gives classes [5, 6, 7, 8, 9] to no "
                     "client (clients x classes-per-client does not cover every class)"]


def test_a_partition_refusal_names_data_subsample(labels):
    cfg = small_config(clients=20, **{"data.subsample": 250})  # Dirichlet, 10 samples each
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flwr-datasets' retries
        with pytest.raises(data.DataError, match=r"partition 'dirichlet' failed for 20 clients "
                           r"on 250 samples: .* raise 'data.subsample' \(now 250\)\."):
            partitions.make_partition(labels, cfg.values)
    cfg = small_config(clients=10, **{"data.partition": "iid", "data.subsample": 15})
    with pytest.raises(data.DataError, match=r"received 1 samples .*raise 'data.subsample' "
                                             r"\(now 15\)"):
        partitions.make_partition(labels, cfg.values)
