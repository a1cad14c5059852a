"""Shards of your own data (issue 50): a site without the pooled data loads its shard with the
source's shape, classes and normalisation from the manifest, tensor for tensor as the
pooled client."""

from __future__ import annotations

import json

import pytest
import torch

from flower_pfl.learning import client_data, own_data, shards
from tests.test_data_sources import make_csv, make_imagefolder, own_config


@pytest.mark.parametrize("kind", ["table", "images"])
def test_a_shard_of_an_own_source_loads_without_the_pool(tmp_path, monkeypatch, kind):
    if kind == "table":
        make_csv(tmp_path / "t.csv")
        cfg = own_config(str(tmp_path / "t.csv"), tmp_path, **{"data.label": "kind"}).values
    else:
        cfg = own_config(str(make_imagefolder(tmp_path / "imgs")), tmp_path).values
    client_data.clear_cache()
    pooled = client_data.load_host_data(cfg, 1)
    x_test = client_data.dense(pooled.x_test)
    manifests = shards.write_shards(cfg, tmp_path / "out")
    assert manifests[1]["source"]["num_classes"] == 3
    json.dumps(manifests)
    monkeypatch.setattr(own_data, "_INFO", {})  # a site: no pool, no settings
    monkeypatch.setattr(own_data, "_SETTINGS", {})
    client_data.clear_cache()
    got = shards.load_shard(tmp_path / "out" / "1", cfg, 1)
    assert got.num_classes == 3
    assert torch.equal(got.x_test, x_test) and torch.equal(got.y_test, pooled.y_test)


def test_a_shard_of_the_random_split_is_refused_naming_data_split(tmp_path):
    make_csv(tmp_path / "t.csv")
    cfg = own_config(str(tmp_path / "t.csv"), tmp_path, **{"data.label": "kind",
                                                            "data.split": "random"}).values
    shards.write_shards(cfg, tmp_path / "out")
    run = dict(cfg, **{"data.split": "stratified"})
    with pytest.raises(shards.ShardError, match=r'data.split: <missing> vs "stratified"'):
        shards.load_shard(tmp_path / "out" / "0", run, 0)
