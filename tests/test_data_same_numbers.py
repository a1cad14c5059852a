"""Same data, same numbers (issue 50): Fashion-MNIST exported to an image folder gives the
built-in ``fmnist`` run's per-client accuracies and losses, bit for bit, with the same seed
and partition.

The partition is one file on both sides (pooled rows for ``fmnist``, the same samples by
path for the folder) giving each client one class: an image folder orders its samples by
class, so only where a client's samples keep their order (one class each) does a client
see its batches in the same order.  The normalisation is FMNIST's (``data.normalize``)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from flower_pfl import config
from flower_pfl.learning import client_data, data, export
from flower_pfl.running import inprocess

PER_CLASS = 30


def _accuracies(results: Path) -> dict:
    with open(results / "clients.csv") as fh:
        return {(r["round"], r["partition-id"]): (r["accuracy"], r["loss"], r["num-train"])
                for r in csv.DictReader(fh)}


def _cfg(tmp_path, dataset, partition_file):
    tree = {"rounds": 2, "clients": 10, "fraction-fit": 1.0, "model": "mclr", "seed": 3,
            "strategy": "fedavg", "cache-dir": str(tmp_path / "cache"),
            "data": {"dataset": dataset, "partition": "file", "subsample": None,
                     "partition-file": str(partition_file)},
            "train": {"epochs": 1, "batch-size": 8, "lr": 0.05}}
    if dataset != "fmnist":
        tree["data"]["normalize"] = [list(m) for m in data.NORMALIZATION["fmnist"]]
    return config.validate(tree, source="test")


@pytest.mark.slow
def test_fmnist_as_an_image_folder_gives_the_builtin_runs_accuracies(tmp_path):
    x, y = data.load_pooled("fmnist")
    rows = {c: np.flatnonzero(np.asarray(y) == c)[:PER_CLASS * 7:7] for c in range(10)}
    folder = tmp_path / "fmnist-png"
    ids = {c: export.export_png(x, y, folder, r.tolist()) for c, r in rows.items()}
    by_row = tmp_path / "rows.json"
    by_row.write_text(json.dumps({"clients": [rows[c].tolist() for c in range(10)]}))
    by_id = tmp_path / "ids.csv"
    by_id.write_text("client,id\n" + "".join(f"{c},{i}\n" for c in range(10) for i in ids[c]))
    client_data.clear_cache()
    inprocess.run(_cfg(tmp_path, "fmnist", by_row), tmp_path / "builtin")
    client_data.clear_cache()
    inprocess.run(_cfg(tmp_path, f"imagefolder:{folder}", by_id), tmp_path / "folder")
    builtin, own = _accuracies(tmp_path / "builtin"), _accuracies(tmp_path / "folder")
    assert len(builtin) == 20 and own == builtin
    folder_x, _ = data.load_pooled(f"imagefolder:{folder}", None, str(tmp_path / "cache"))
    assert np.array_equal(folder_x[:PER_CLASS], np.asarray(x)[rows[0]])  # the same pixels
