"""Your own data (issue 50): image folders, tables, NPZ, ``module:function`` and a local
Hugging Face dataset, read, inferred, normalised and checked against the model before start."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from flower_pfl import config
from flower_pfl.learning import client_data, data, own_data, partitions, sources
from flower_pfl.reliability import preflight as pf
from tests.conftest import small_config

COUNTS = (5, 9, 4)  # images per class: asymmetric


def make_imagefolder(root, counts=COUNTS, size=16, mode="RGB", nested=False):
    """``root/<class>/<i>.png`` (or ``root/train|test/<class>/...``): class c's pixels are
    all ``40 * c + i`` (channel k: + k), so every image is known by hand."""
    from PIL import Image

    for c, n in enumerate(counts):
        for i in range(n):
            split = ("train" if i < n - 1 else "test") if nested else ""
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            value = 40 * c + i
            a = np.full((size, size, 3), [value, value + 1, value + 2], dtype=np.uint8)
            im = Image.fromarray(a if mode == "RGB" else a[:, :, 0], mode=mode)
            im.save(folder / f"{i:03d}.png")
    return root


def make_csv(path, n=60, seed=0):
    """Two informative features, one noise column, a string label and a site column."""
    rng = np.random.default_rng(seed)
    import pandas as pd

    label = rng.integers(0, 3, n)
    frame = pd.DataFrame({"f1": label * 2.0 + rng.normal(0, 0.1, n),
                          "f2": -label + rng.normal(0, 0.1, n),
                          "noise": rng.normal(0, 1, n),
                          "kind": np.array(["ant", "bee", "cat"])[label],
                          "site": np.array(["a", "b", "c", "d"])[np.arange(n) % 4]})
    frame.to_csv(path, index=False)
    return frame


def own_config(dataset, tmp_path, **more):
    tree = {"rounds": 2, "clients": 3, "fraction-fit": 1.0, "model": "mclr", "seed": 0,
            "cache-dir": str(tmp_path / "cache"),
            "data": {"dataset": dataset, "partition": "iid", "subsample": None},
            "train": {"epochs": 1, "batch-size": 4, "lr": 0.05}}
    return config.validate(config.merge(tree, more), source="test")


def test_imagefolder_reads_classes_channels_and_pixels_by_hand(tmp_path):
    root = make_imagefolder(tmp_path / "imgs")
    cfg = own_config(f"imagefolder:{root}", tmp_path).values
    x, y = data.load_pooled(cfg["data.dataset"], None, cfg["cache-dir"],
                            own_data.settings_of(cfg))
    assert x.shape == (18, 3, 16, 16) and x.dtype == np.uint8
    assert np.bincount(y).tolist() == list(COUNTS)
    # sorted class folders, sorted files: row 5 is class1/000.png, value 40, channels +0/1/2
    assert y[5] == 1 and x[5, :, 0, 0].tolist() == [40, 41, 42]
    info = own_data.info(cfg["data.dataset"])
    assert info.shape == (3, 16, 16) and info.num_classes == 3
    assert info.classes == ("class0", "class1", "class2")
    assert data.NUM_CLASSES[cfg["data.dataset"]] == 3
    assert data.input_shape(cfg["data.dataset"]) == (3, 16, 16)
    # auto normalisation: channel k's mean of value/255 over every pixel
    values = np.concatenate([40 * c + np.arange(n) for c, n in enumerate(COUNTS)])
    assert info.mean[0] == pytest.approx(values.mean() / 255)
    assert info.mean[2] == pytest.approx((values + 2).mean() / 255)
    assert info.std[1] == pytest.approx(values.std() / 255)
    t = data.to_tensor(np.array(x[5:6]), cfg["data.dataset"])
    assert float(t[0, 1, 0, 0]) == pytest.approx((41 / 255 - info.mean[1]) / info.std[1],
                                                 rel=1e-5)


def test_greyscale_nested_folder_pools_splits_and_resizes(tmp_path):
    root = make_imagefolder(tmp_path / "grey", mode="L", nested=True, size=20)
    cfg = own_config(str(root), tmp_path, **{"data.image-size": 12,
                                             "data.normalize": "none"}).values
    x, y = data.load_pooled(cfg["data.dataset"], None, cfg["cache-dir"],
                            own_data.settings_of(cfg))
    assert x.shape == (18, 1, 12, 12)  # greyscale: one channel; resized to 12 x 12
    assert np.bincount(y).tolist() == list(COUNTS)  # test/ pooled with train/
    assert own_data.info(str(root)).mean == (0.0,) and own_data.info(str(root)).std == (1.0,)


def test_images_of_two_sizes_are_refused_naming_image_size(tmp_path):
    root = make_imagefolder(tmp_path / "mixed", counts=(2, 2))
    make_imagefolder(tmp_path / "mixed", counts=(0, 0, 2), size=10)
    with pytest.raises(data.DataError, match="set data.image-size"):
        data.load_pooled(f"imagefolder:{root}", None, str(tmp_path / "c"))


def test_csv_features_label_and_columns(tmp_path):
    frame = make_csv(tmp_path / "t.csv")
    cfg = own_config(str(tmp_path / "t.csv"), tmp_path,
                     **{"data.features": ["f1", "f2"], "data.label": "kind"}).values
    x, y = data.load_pooled(cfg["data.dataset"], None, cfg["cache-dir"],
                            own_data.settings_of(cfg))
    assert x.shape == (60, 2) and x.dtype == np.float32
    assert np.array_equal(y, frame["kind"].map({"ant": 0, "bee": 1, "cat": 2}).to_numpy())
    info = own_data.info(cfg["data.dataset"])
    assert info.kind == "table" and info.shape == (2,) and info.classes == ("ant", "bee", "cat")
    t = data.to_tensor(np.array(x[:4]), cfg["data.dataset"])
    expected = (frame[["f1", "f2"]].to_numpy()[:4] - frame[["f1", "f2"]].mean().to_numpy()) \
        / frame[["f1", "f2"]].std(ddof=0).to_numpy()
    np.testing.assert_allclose(t.numpy(), expected, rtol=1e-4)
    cols = partitions.source_columns(cfg)
    assert sorted(cols) == ["noise", "site"] or sorted(cols) == ["site"]


def test_default_features_are_every_numeric_column_but_the_label(tmp_path):
    make_csv(tmp_path / "t.csv")
    cfg = own_config(f"table:{tmp_path / 't.csv'}", tmp_path, **{"data.label": "kind"}).values
    x, _ = data.load_pooled(cfg["data.dataset"], None, cfg["cache-dir"],
                            own_data.settings_of(cfg))
    assert x.shape == (60, 3)  # f1, f2, noise; not kind (label), not site (strings)


@pytest.mark.parametrize("more, match", [
    ({"data.label": "nope"}, r"'data.label' = 'nope': no such column"),
    ({"data.label": "kind", "data.features": ["f1", "zz"]},
     r"'data.features' = \['f1', 'zz'\]: no column\(s\) \['zz'\]"),
    ({"data.label": "kind", "data.features": ["f1", "site"]}, r"\['site'\] are not numeric"),
])
def test_table_mistakes_are_refused_naming_the_key(tmp_path, more, match):
    make_csv(tmp_path / "t.csv")
    cfg = own_config(str(tmp_path / "t.csv"), tmp_path, **more)
    with pytest.raises(pf.PreflightError, match=match):
        pf.preflight(cfg)


def test_npz_and_module_function_sources(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 2, 3)).astype(np.float32)
    y = np.repeat([3, 7], 15)
    np.savez(tmp_path / "a.npz", x=x, y=y)
    got_x, got_y = data.load_pooled(str(tmp_path / "a.npz"), None, str(tmp_path / "c"))
    assert got_x.shape == (30, 6) and np.array_equal(got_y, np.repeat([0, 1], 15))
    (tmp_path / "mydata.py").write_text(
        "import numpy as np\n"
        "def load():\n"
        "    return np.zeros((12, 1, 16, 16), np.uint8) + np.arange(12, dtype=np.uint8)"
        "[:, None, None, None], np.arange(12) % 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    got_x, got_y = data.load_pooled("mydata:load", None, str(tmp_path / "c"))
    assert got_x.shape == (12, 1, 16, 16) and got_x[7, 0, 0, 0] == 7
    assert own_data.info("mydata:load").num_classes == 3
    sys.modules.pop("mydata", None)


def test_hf_local_dataset_through_flwr_datasets(tmp_path):
    import pandas as pd

    folder = tmp_path / "hfdata"
    folder.mkdir()
    make_csv(tmp_path / "t.csv")
    pd.read_csv(tmp_path / "t.csv").to_parquet(folder / "train.parquet")
    cfg = own_config(f"hf:{folder}", tmp_path, **{"data.label": "kind",
                                                  "data.features": ["f1", "f2"]}).values
    x, y = data.load_pooled(cfg["data.dataset"], None, cfg["cache-dir"],
                            own_data.settings_of(cfg))
    assert x.shape == (60, 2) and own_data.info(cfg["data.dataset"]).num_classes == 3


def test_hf_unknown_offline_is_one_clear_error(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub.constants

    for module, name in ((datasets.config, "HF_HUB_OFFLINE"),
                         (datasets.config, "HF_DATASETS_OFFLINE"),
                         (huggingface_hub.constants, "HF_HUB_OFFLINE")):
        monkeypatch.setattr(module, name, True)  # as HF_HUB_OFFLINE=1 at import
    with pytest.raises(data.DataError, match=r"'hf:no-such-user/no-such-set' cannot be loaded"
                       r".*Run once online.*or download it"):
        data.load_pooled("hf:no-such-user/no-such-set", None, str(tmp_path / "c"))


def test_a_bad_source_is_refused_by_validate_naming_data_dataset(tmp_path):
    with pytest.raises(config.ConfigError, match=r"data.dataset = 'fmnst' is neither"):
        own_config("fmnst", tmp_path)
    with pytest.raises(config.ConfigError, match=r"image folder .*nowhere is not a directory"):
        own_config(f"imagefolder:{tmp_path / 'nowhere'}", tmp_path)
    with pytest.raises(config.ConfigError, match=r"'data.image-size' = 8 is for your own data"):
        small_config(**{"data.image-size": 8})
    assert sources.parse_source("fmnist") is None


def test_display_names_are_one_folder_name():
    assert sources.display_name("fmnist") == "fmnist"
    assert sources.display_name("imagefolder:/data/x ray/") == "imagefolder-x_ray"
    assert sources.display_name("/data/t.csv") == "t.csv"
    assert sources.display_name("hf:user/set") == "hf-set"
    assert sources.display_name("mydata:load") == "mydata-load"


@pytest.mark.parametrize("model, size", [("cnn", None), ("cnn", 10)])
def test_a_model_that_does_not_fit_the_data_is_refused_before_start(tmp_path, model, size):
    """A table's (3,) samples or 10 x 10 images cannot go through the CNN (it needs >= 16
    px): refused by the preflight check, before any folder is made."""
    if size is None:
        make_csv(tmp_path / "t.csv")
        cfg = own_config(str(tmp_path / "t.csv"), tmp_path, model=model,
                         **{"data.label": "kind"})
    else:
        root = make_imagefolder(tmp_path / "imgs")
        cfg = own_config(str(root), tmp_path, model=model, **{"data.image-size": size})
    out = tmp_path / "results" / "run"
    match = (rf"model '{model}' needs images \(channels, height, width\) but dataset '.*' "
             rf"gives samples of 3 features: use model 'mclr' or 'dnn'$" if size is None
             else rf"model '{model}' does not fit dataset")
    with pytest.raises(pf.PreflightError, match=match):
        pf.preflight(cfg, results_dir=out, initial_out=out / "initial.npz")
    assert not (tmp_path / "results").exists()


def test_client_tensors_of_a_table_and_an_image_folder(tmp_path):
    make_csv(tmp_path / "t.csv")
    cfg = own_config(str(tmp_path / "t.csv"), tmp_path, **{"data.label": "kind"}).values
    client_data.clear_cache()
    d = client_data.load_client_data(cfg, 1)
    assert d.x_train.shape[1:] == (3,) and d.num_classes == 3
    assert d.num_train + d.num_test == 20
    root = make_imagefolder(tmp_path / "imgs")
    cfg = own_config(str(root), tmp_path).values
    d = client_data.load_client_data(cfg, 0)
    assert tuple(d.x_train[:2].shape) == (2, 3, 16, 16) and d.num_classes == 3
    json.dumps(cfg)  # the run's values stay JSON (they travel to the clients)


def test_given_normalisation_is_used_and_its_width_checked(tmp_path):
    root = make_imagefolder(tmp_path / "imgs")
    cfg = own_config(str(root), tmp_path, **{"data.normalize": [[0.5, 0.25, 0.0],
                                                                [0.5, 0.25, 1.0]]}).values
    data.load_pooled(cfg["data.dataset"], None, cfg["cache-dir"], own_data.settings_of(cfg))
    assert data.NORMALIZATION[str(root)] == ((0.5, 0.25, 0.0), (0.5, 0.25, 1.0))
    bad = own_config(str(root), tmp_path, **{"data.normalize": [[0.5], [0.5]]})
    with pytest.raises(pf.PreflightError, match=r"'data.normalize' gives 1 mean\(s\) and "
                       r"std\(s\) but the data have 3 channels"):
        pf.preflight(bad)
    with pytest.raises(config.ConfigError, match="data.normalize"):
        own_config(str(root), tmp_path, **{"data.normalize": [[0.5], [0.0]]})


def test_hf_local_image_folder_gives_images(tmp_path):
    """A local folder of class subfolders through ``hf:``: Hugging Face's imagefolder
    builder, an ``Image`` column and a ``label`` column."""
    root = make_imagefolder(tmp_path / "imgs")
    x, y = data.load_pooled(f"hf:{root}", None, str(tmp_path / "c"))
    assert x.shape == (18, 3, 16, 16) and x.dtype == np.uint8
    assert np.bincount(y).tolist() == list(COUNTS)
