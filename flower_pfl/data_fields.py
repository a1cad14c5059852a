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
PARTITIONS = ("iid", "dirichlet", "pathological", "practical")

DATA_FIELDS: dict[str, Field] = {
    "data.dataset": Field((str,), "fmnist", in_(DATASETS), f"one of {list(DATASETS)}"),
    "data.root": Field((str,), None, None, "a directory holding the dataset", nullable=True),
    "data.partition": Field((str,), "dirichlet", in_(PARTITIONS), f"one of {list(PARTITIONS)}"),
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


def data_checks(values: Mapping[str, Any]) -> list[str]:
    """The ``data.*`` problems that need more than one key (every key already has its type):
    the model that fits the synthetic data, the synthetic sample range, and the partitions'
    class counts against the dataset's classes."""
    problems = []
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
