"""The partition and pooled caches are keyed by what the data are (issue 50): another
``data.root``, or changed files under the same one, rebuild them; nothing stale is reused."""

from __future__ import annotations

import os

import numpy as np

from flower_pfl.learning import client_data, data, own_data, partitions, sources
from tests.test_data_sources import make_imagefolder, own_config


def _partition(cfg):
    x, y = data.load_pooled(cfg["data.dataset"], cfg["data.root"], cfg["cache-dir"],
                            own_data.settings_of(cfg))
    return x, y, partitions.get_partition(cfg, y)


def test_a_changed_data_root_rebuilds_the_partition(tmp_path):
    """The issue's case: the same settings on other data (here with more samples) must not
    reuse the first data's index lists (they were out of range, or silently wrong)."""
    small = make_imagefolder(tmp_path / "small", counts=(3, 3))
    big = make_imagefolder(tmp_path / "big", counts=(10, 12, 8))
    a = own_config("imagefolder:", tmp_path, **{"data.root": str(small)}).values
    b = own_config("imagefolder:", tmp_path, **{"data.root": str(big)}).values
    assert partitions.cache_key(a) != partitions.cache_key(b)
    _, ya, pa = _partition(a)
    partitions.clear_cache()  # the disk copy is what a later run would find
    _, yb, pb = _partition(b)
    assert len(ya) == 6 and len(yb) == 30
    held = np.sort(np.concatenate(pb.train + pb.test))
    assert np.array_equal(held, np.arange(30))  # every sample of the new data, once
    assert own_data.info("imagefolder:").num_classes == 3  # not the first root's 2


def test_changed_files_under_the_same_root_rebuild_pool_and_partition(tmp_path):
    root = make_imagefolder(tmp_path / "imgs", counts=(4, 4))
    cfg = own_config(str(root), tmp_path).values
    key = partitions.cache_key(cfg)
    x1, y1, _ = _partition(cfg)
    assert np.bincount(y1).tolist() == [4, 4]
    make_imagefolder(root, counts=(0, 0, 5))  # a third class appears
    first = root / "class0" / "000.png"
    os.utime(first, ns=(1, 1))  # and a file is touched
    data.clear_cache()  # a new process: fingerprints are remembered per process
    partitions.clear_cache()
    assert partitions.cache_key(cfg) != key
    x2, y2, p2 = _partition(cfg)
    assert np.bincount(y2).tolist() == [4, 4, 5]
    assert np.sort(np.concatenate(p2.train + p2.test)).tolist() == list(range(13))


def test_the_same_data_reuse_the_cache(tmp_path, monkeypatch):
    root = make_imagefolder(tmp_path / "imgs", counts=(4, 4))
    cfg = own_config(str(root), tmp_path).values
    _, _, first = _partition(cfg)
    data.clear_cache()
    partitions.clear_cache()
    monkeypatch.setattr(sources, "load_source", lambda *a: (_ for _ in ()).throw(
        AssertionError("read again")))
    monkeypatch.setattr(partitions, "make_partition", lambda *a: (_ for _ in ()).throw(
        AssertionError("partitioned again")))
    _, _, again = _partition(cfg)
    assert all(np.array_equal(a, b) for a, b in zip(first.train, again.train))


def test_a_builtin_dataset_key_names_its_root_and_its_files(tmp_path):
    cfg = own_config("fmnist", tmp_path).values
    other = dict(cfg, **{"data.root": str(tmp_path / "copy")})
    (tmp_path / "copy").mkdir()
    assert partitions.cache_key(cfg) != partitions.cache_key(other)
    before = partitions.cache_key(other)
    (tmp_path / "copy" / "train-images-idx3-ubyte.gz").write_bytes(b"x")  # the files change
    sources.clear_fingerprints()
    assert partitions.cache_key(other) != before
    assert partitions.partition_key(other) == partitions.partition_key(other)  # settings same


def test_client_data_follows_a_changed_root(tmp_path):
    a = make_imagefolder(tmp_path / "a", counts=(3, 3))
    b = make_imagefolder(tmp_path / "b", counts=(5, 4, 3))
    client_data.clear_cache()
    da = client_data.load_client_data(
        own_config("imagefolder:", tmp_path, **{"data.root": str(a)}).values, 0)
    db = client_data.load_client_data(
        own_config("imagefolder:", tmp_path, **{"data.root": str(b)}).values, 0)
    assert (da.num_classes, db.num_classes) == (2, 3)
    assert da.num_train + da.num_test == 2 and db.num_train + db.num_test == 4


def test_another_local_split_is_another_partition(tmp_path):
    """Issue 67: ``data.split`` is part of the partition's cache name: the random split after
    a stratified one on the same data is the random split, from memory and from disk."""
    root = make_imagefolder(tmp_path / "imgs", counts=(6, 12, 3))
    strat = own_config(str(root), tmp_path, clients=2, **{"data.split": "stratified"}).values
    rand = own_config(str(root), tmp_path, clients=2, **{"data.split": "random"}).values
    assert partitions.partition_key(strat) != partitions.partition_key(rand)
    _, y, first = _partition(strat)
    for clear in (False, True):  # the memory copy, then the disk copy
        if clear:
            partitions.clear_cache()
        got = partitions.get_partition(rand, y)
        want = partitions.make_partition(y, rand)
        assert all(np.array_equal(a, b) for a, b in zip(got.test, want.test))
        assert not all(np.array_equal(a, b) for a, b in zip(got.test, first.test))
