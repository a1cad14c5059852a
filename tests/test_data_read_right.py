"""Data read as the user meant it (issue 67): hidden and system entries of an image folder
skipped and named in one line (never a class, never hiding the split folders), the class
order declared for a pooled source, and ``validate`` printing what it inferred."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from flower_pfl import cli
from flower_pfl.learning import data, own_data, sources
from flower_pfl.learning.data_summary import describe
from flower_pfl.reliability import preflight as pf
from tests.test_data_sources import make_csv, make_imagefolder, own_config

COUNTS = (5, 9, 4)


def _junk(root, image):
    """What Jupyter, macOS and Windows leave: .ipynb_checkpoints/ (with one image or
    empty), .DS_Store, ._* companions (not images), __MACOSX/, Thumbs.db."""
    from PIL import Image

    (root / ".ipynb_checkpoints").mkdir()
    if image:
        Image.new("RGB", (16, 16)).save(root / ".ipynb_checkpoints" / "x-checkpoint.png")
    (root / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / "__MACOSX").mkdir()
    for png in sorted(root.rglob("*.png")):
        if ".ipynb_checkpoints" not in png.parts:
            (png.parent / f"._{png.name}").write_bytes(b"\0\5\26\7 AppleDouble")
            break
    (root / "Thumbs.db").write_bytes(b"x")


def _read(root):
    data.clear_cache()
    own_data.clear_cache()
    return sources.load_source(str(root), {"data.root": None})


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "split"])
@pytest.mark.parametrize("image", [False, True], ids=["empty", "holding-an-image"])
def test_hidden_and_system_entries_are_skipped_and_named(tmp_path, nested, image):
    root = make_imagefolder(tmp_path / "imgs", counts=COUNTS, nested=nested)
    clean = _read(root)
    _junk(root, image)
    got = _read(root)
    assert got.classes == ["class0", "class1", "class2"]  # never 'train' and 'test'
    assert np.bincount(got.y).tolist() == list(COUNTS)
    assert np.array_equal(got.x, clean.x) and np.array_equal(got.y, clean.y)
    companion = "test/class0/._004.png" if nested else "class0/._000.png"
    assert got.skipped == sorted([".DS_Store", ".ipynb_checkpoints/", "Thumbs.db",
                                  "__MACOSX/", companion])


def test_the_skipped_entries_are_one_line_and_a_hidden_folder_inside_a_class_too(tmp_path,
                                                                                 capsys):
    root = make_imagefolder(tmp_path / "imgs", counts=(3, 3))
    from PIL import Image

    (root / "class1" / ".ipynb_checkpoints").mkdir()
    Image.new("RGB", (16, 16)).save(root / "class1" / ".ipynb_checkpoints" / "a.png")
    cfg = own_config(str(root), tmp_path, clients=2).values
    x, y = data.load_pooled(cfg["data.dataset"], None, cfg["cache-dir"],
                            own_data.settings_of(cfg))
    assert np.bincount(y).tolist() == [3, 3]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"flower-pfl: data.dataset = {str(root)!r}: skipped 1 hidden or system "
                   f"entry (not data): class1/.ipynb_checkpoints/"]


def test_a_declared_class_order_gives_the_labels_and_a_mismatch_is_refused(tmp_path):
    """Alphabetically class0 < class1 < class2; declared [class2, class0, class1], the 4
    images of class2 are label 0, the 5 of class0 label 1."""
    root = make_imagefolder(tmp_path / "imgs", counts=COUNTS)
    cfg = own_config(str(root), tmp_path,
                     **{"data.classes": ["class2", "class0", "class1"]}).values
    _, y = data.load_pooled(cfg["data.dataset"], None, cfg["cache-dir"],
                            own_data.settings_of(cfg))
    assert np.bincount(y).tolist() == [4, 5, 9]
    assert own_data.info(cfg["data.dataset"]).classes == ("class2", "class0", "class1")
    assert np.asarray(y)[:5].tolist() == [1] * 5  # the pooled order stays: class0 first
    for declared, match in [(["class2", "class0"], r"\['class1'\] not declared"),
                            (["class2", "class0", "class1", "owl"], r"\['owl'\] without "
                                                                     r"samples")]:
        bad = own_config(str(root), tmp_path, **{"data.classes": declared})
        with pytest.raises(pf.PreflightError, match=r"'data.classes' = .* must name exactly "
                                                    r"the classes .*" + match):
            pf.preflight(bad)


def _validate(tmp_path, capsys, tree):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    assert cli.main(["validate", "--config", str(path)]) == 0
    return capsys.readouterr().out


def test_validate_prints_classes_features_skipped_entries_and_clients(tmp_path, capsys):
    root = make_imagefolder(tmp_path / "imgs", counts=COUNTS, nested=True)
    _junk(root, image=True)
    base = {"rounds": 1, "clients": 2, "model": "mclr", "seed": 0, "strategy": "fedavg",
            "cache-dir": str(tmp_path / "cache"), "output-dir": str(tmp_path / "results"),
            "train": {"epochs": 1, "batch-size": 4, "lr": 0.05}}
    out = _validate(tmp_path, capsys, {**base, "data": {
        "dataset": str(root), "partition": "iid", "subsample": None}})
    assert "data: 18 samples, images of shape (3, 16, 16); 3 classes (class index: name " \
           "count): 0: class0 5, 1: class1 9, 2: class2 4" in out
    assert "skipped 5 hidden or system entries (not data): .DS_Store, .ipynb_checkpoints/" in out
    assert "clients: 2 (partition iid; client: samples): 0 9, 1 9" in out
    make_csv(tmp_path / "t.csv", n=30)  # the same lines, without a second child process
    cfg = own_config(str(tmp_path / "t.csv"), tmp_path, clients=4, **{
        "data.label": "kind", "data.partition": "natural", "data.partition-by": "site"})
    pf.preflight(cfg)
    out = "\n".join(describe(cfg.values))
    assert "features (in order): f1, f2, noise" in out
    assert "clients: 4 (partition natural; client: samples): 0 (a) 8, 1 (b) 8, 2 (c) 7, " \
           "3 (d) 7" in out


def test_another_declared_class_order_is_another_partition(tmp_path):
    """The labels follow data.classes, so the partition's cache name does too: a
    pathological partition (one class per client) of the reordered labels is rebuilt."""
    from flower_pfl.learning import partitions

    root = make_imagefolder(tmp_path / "imgs", counts=COUNTS)
    more = {"data.partition": "pathological", "data.classes-per-client": 1}
    plain = own_config(str(root), tmp_path, **more).values
    moved = own_config(str(root), tmp_path, **more,
                       **{"data.classes": ["class2", "class0", "class1"]}).values
    assert partitions.partition_key(plain) != partitions.partition_key(moved)
    assert partitions.partition_key(plain) == partitions.partition_key(
        own_config(str(root), tmp_path, **more, **{"data.classes": None}).values)
