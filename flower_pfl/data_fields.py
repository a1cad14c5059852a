"""The ``data.*`` keys of the run configuration: the data source, its partition into clients
and each client's local split (read by :mod:`flower_pfl.learning.data`,
:mod:`flower_pfl.learning.partitions` and :mod:`flower_pfl.learning.shards`).

:data:`DATA_FIELDS` is merged into :data:`flower_pfl.config.FIELDS`;
:func:`data_checks` is the section's part of the cross-key checks, run once every key has
its own type.  No torch, no Flower (``flower-pfl validate`` stays light).
"""

from __future__ import annotations

from typing import Any, Mapping

from flower_pfl.fields import FRACTION, OPEN_FRACTION, POS, Field, in_

DATASETS = ("fmnist", "mnist", "emnist", "cifar10", "cifar100", "synthetic-gaussian")
PARTITIONS = ("iid", "dirichlet", "pathological", "practical", "natural", "file")
SPLITS = ("stratified", "random")
NORMALIZE = ("auto", "none")
#: keys of your own data sources (flower_pfl.learning.sources), refused for a built-in name
SOURCE_KEYS = ("data.image-size", "data.features", "data.label", "data.normalize")

DATA_FIELDS: dict[str, Field] = {
    "data.dataset": Field((str,), "fmnist", lambda v: bool(v.strip()),
                          f"one of {list(DATASETS)}, or your own data: 'imagefolder:<dir>', "
                          f"'table:<file.csv|.parquet|.npz>', 'hf:<name>', 'module:function' "
                          f"or 'site' (each node's own data; docs/own-data.md)"),
    "data.root": Field((str,), None, None, "a directory holding the dataset", nullable=True),
    "data.partition": Field((str,), "dirichlet", in_(PARTITIONS), f"one of {list(PARTITIONS)}"),
    "data.split": Field((str,), "stratified", in_(SPLITS), f"one of {list(SPLITS)} (each "
                        f"client's train/test split: per class, or shuffled at random)"),
    "data.partition-by": Field((str,), None, None, "a column naming each sample's client "
                               "(partition natural) or its id (partition file)", nullable=True),
    "data.partition-file": Field((str,), None, None, "a JSON or CSV file: client -> sample "
                                 "indices or ids (partition file)", nullable=True),
    "data.image-size": Field((int,), None, POS, "an integer >= 1 or null (images resized to "
                             "size x size; null: their own size)", nullable=True),
    "data.normalize": Field((str, list), "auto", lambda v: v in NORMALIZE if isinstance(v, str)
                            else _mean_std(v), f"one of {list(NORMALIZE)} (auto: per-channel/"
                            f"feature mean and std of the data; none: 0 and 1) or [[mean, ...], "
                            f"[std, ...]] (one per channel/feature, std > 0)"),
    "data.features": Field((list, str), None, None, "a column name or a list of them (null: "
                           "every numeric column but the label's)", nullable=True),
    "data.label": Field((str,), None, None, "the label column (null: 'label'; NPZ: 'y')",
                        nullable=True),
    # per-site data (data.dataset: site): what every site shares, declared (learning/site_data)
    "data.classes": Field((list,), None, lambda v: len(v) >= 2 and all(
        isinstance(c, (str, int)) and not isinstance(c, bool) for c in v), "a list of 2+ "
        "class names (folder names / label values, str or int) in class order, or null "
        "(data.dataset: site needs it)", nullable=True),
    "data.input-shape": Field((list,), None, lambda v: len(v) in (1, 3) and all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in v)
        and (len(v) == 1 or v[0] in (1, 3)), "[C, H, W] images (C 1 or 3) or [F] a table's "
        "features, integers >= 1, or null (data.dataset: site needs it)", nullable=True),
    "data.alpha": Field((float, int), 0.5, POS, "a number > 0 (Dirichlet concentration)"),
    "data.classes-per-client": Field((int,), 2, POS, "an integer >= 1"),
    "data.groups": Field((int,), 3, POS, "an integer >= 1"),
    "data.dominant-share": Field((float, int), 0.8, FRACTION, "a number in (0, 1]"),
    "data.max-train-samples": Field((int,), None, POS, "an integer >= 1 or null", nullable=True),
    "data.subsample": Field((int,), None, POS, "an integer >= 1 or null (pooled samples used)",
                            nullable=True),
    "data.test-fraction": Field((float,), 0.25, OPEN_FRACTION, "a number in (0, 1)"),
    "data.min-samples": Field((int,), 10, POS, "an integer >= 1"),
    # Self-FL section 2.1 two-level Gaussian: theta_m ~ N(theta0, sigma0^2), z ~ N(theta_m, noise^2)
    "data.synthetic-theta0": Field((float, int), 0.0, None, "a number"),
    "data.synthetic-sigma0-sq": Field((float, int), 1.0, POS, "a number > 0 (inter-client "
                                      "variance sigma_0^2)"),
    "data.synthetic-noise-sq": Field((float, int), 1.0, POS, "a number > 0 (per-sample "
                                     "variance sigma^2)"),
    "data.synthetic-samples": Field((int,), 20, POS, "an integer >= 1 (samples N_m per client)"),
    "data.synthetic-samples-max": Field((int,), None, POS, "an integer >= 1 or null (N_m drawn "
                                        "uniformly in [samples, samples-max])", nullable=True),
}


def _mean_std(v: list[Any]) -> bool:
    """``[[mean, ...], [std, ...]]``: two equal-length lists of numbers, every std > 0."""
    if len(v) != 2 or not all(isinstance(part, list) and part for part in v):
        return False
    numbers = all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in v[0] + v[1])
    return numbers and len(v[0]) == len(v[1]) and all(s > 0 for s in v[1])


def data_checks(values: Mapping[str, Any]) -> list[str]:
    """The ``data.*`` problems that need more than one key (every key already has its type):
    the model that fits the synthetic data, the synthetic sample range, and the partitions'
    class counts against the dataset's classes."""
    from flower_pfl.learning import site_data, sources

    dataset = values["data.dataset"]
    site = dataset == site_data.SITE
    problems = site_data.config_problems(values) if site else \
        sources.check_source(dataset, values["data.root"])
    problems += site_data.declared_problems(values)
    if site and not problems:
        site_data.register(values)  # what the model and every site follow
    own = not problems and dataset not in DATASETS and not site
    if own:
        from flower_pfl.learning import own_data  # numpy only

        own_data.remember(values)
    for key in SOURCE_KEYS:
        if not own and dataset in DATASETS and values[key] != DATA_FIELDS[key].default:
            problems.append(f"'{key}' = {values[key]!r} is for your own data sources, not the "
                            f"built-in data.dataset = {dataset!r}")
    problems += _partition_key_checks(values)
    synthetic = values["data.dataset"] == "synthetic-gaussian"
    if synthetic != (values["model"] == "scalar"):
        problems.append(f"'model' = {values['model']!r} does not fit data.dataset = "
                        f"{values['data.dataset']!r}: the scalar model goes with "
                        f"'synthetic-gaussian' and only there")
    mx = values["data.synthetic-samples-max"]
    if mx is not None and mx < values["data.synthetic-samples"]:
        problems.append(f"'data.synthetic-samples-max' = {mx} is below 'data.synthetic-samples'")
    from flower_pfl.learning.data import NUM_CLASSES  # numpy only, no torch

    classes = NUM_CLASSES.get(values["data.dataset"])
    if values["data.partition"] == "pathological" and classes is not None \
            and values["data.classes-per-client"] > classes:
        problems.append(f"'data.classes-per-client' = {values['data.classes-per-client']} "
                        f"exceeds the {classes} classes of {values['data.dataset']}")
    if values["data.partition"] == "practical":
        if classes is not None and values["data.groups"] > classes:
            problems.append(f"'data.groups' = {values['data.groups']} exceeds the {classes} "
                            f"classes of {values['data.dataset']} (each group needs its own "
                            f"dominant classes)")
        if values["data.groups"] > values["clients"]:
            problems.append(f"'data.groups' = {values['data.groups']} exceeds 'clients' = "
                            f"{values['clients']} (each group needs a client)")
    return problems


def _partition_key_checks(values: Mapping[str, Any]) -> list[str]:
    """``natural`` needs ``data.partition-by``, ``file`` needs ``data.partition-file``;
    neither reads ``data.subsample``; the keys are refused where nothing reads them."""
    kind, problems = values["data.partition"], []
    if kind == "natural" and not values["data.partition-by"]:
        problems.append("data.partition = 'natural' needs 'data.partition-by' (the column "
                        "naming each sample's client)")
    if kind == "file" and not values["data.partition-file"]:
        problems.append("data.partition = 'file' needs 'data.partition-file' (a JSON or CSV "
                        "file: client -> sample indices)")
    if kind not in ("natural", "file") and values["data.partition-by"]:
        problems.append(f"'data.partition-by' = {values['data.partition-by']!r} is read by the "
                        f"natural and file partitions, not by data.partition = {kind!r}")
    if kind != "file" and values["data.partition-file"]:
        problems.append(f"'data.partition-file' is read by data.partition = 'file', not by "
                        f"{kind!r}")
    if kind in ("natural", "file") and values["data.subsample"]:
        problems.append(f"'data.subsample' = {values['data.subsample']} does not apply to "
                        f"data.partition = {kind!r} (it lists every client's samples); set "
                        f"it to null")
    if kind in ("natural", "file") and values["data.dataset"] in DATASETS:
        if kind == "natural" or values["data.partition-by"]:
            problems.append(f"data.partition = {kind!r} with 'data.partition-by' needs a "
                            f"source with columns (a table or 'hf:'), not "
                            f"{values['data.dataset']!r}")
    return problems
