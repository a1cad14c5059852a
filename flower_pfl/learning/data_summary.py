"""What a run's data are, as ``flower-pfl validate`` prints them after its checks: the
samples and their shape, each class with its count (your own data: the class names, in
class order), a table's feature columns, the hidden or system entries an image folder's
reader skipped, and every client with its sample count (a ``natural`` partition: its id).
Reads the caches the preflight check has just filled; no torch."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

#: names shown in one line before "... (N more)"
SHOWN = 12


def _listing(items: list[str]) -> str:
    more = len(items) - SHOWN
    return ", ".join(items[:SHOWN]) + (f", ... ({more} more)" if more > 0 else "")


def describe(cfg: Mapping[str, Any]) -> list[str]:
    """The lines (see the module docstring) for ``cfg``'s data; none for the synthetic task
    and per-site data (no pool exists to read).  Raises DataError as the loaders do."""
    from flower_pfl.learning import data, fixed_partitions, own_data, partitions, sources

    dataset = cfg["data.dataset"]
    if dataset in ("synthetic-gaussian", "site"):
        return []
    x, y = data.load_pooled(dataset, cfg.get("data.root"), cfg.get("cache-dir"),
                            own_data.settings_of(cfg))
    y = np.asarray(y)
    own = dataset not in sources.BUILTIN
    counts = np.bincount(y)
    names = list(own_data.info(dataset).classes) if own else [str(c) for c in
                                                               range(len(counts))]
    kind = "images" if x.dtype == np.uint8 else "features"
    lines = [f"data: {len(y)} samples, {kind} of shape {tuple(int(s) for s in x.shape[1:])}; "
             f"{len(counts)} classes (class index: name count): "
             + _listing([f"{i}: {n} {int(c)}" for i, (n, c) in enumerate(zip(names, counts))])]
    if own and own_data.FEATURES.get(dataset):
        lines.append(f"features (in order): {_listing(own_data.FEATURES[dataset])}")
    if own and own_data.SKIPPED.get(dataset):
        lines.append(own_data.skipped_line(dataset, own_data.SKIPPED[dataset]))
    part = partitions.get_partition(cfg, y)
    sizes = [len(tr) + len(te) for tr, te in zip(part.train, part.test)]
    labels = [str(i) for i in range(len(sizes))]
    if cfg["data.partition"] == "natural":
        column = partitions.source_columns(cfg)[str(cfg["data.partition-by"])]
        ids = np.unique(fixed_partitions.natural_ids(column, "data.partition-by"))
        labels = [f"{i} ({v})" for i, v in enumerate(ids.tolist())]
    lines.append(f"clients: {len(sizes)} (partition {cfg['data.partition']}; client: samples): "
                 + _listing([f"{n} {s}" for n, s in zip(labels, sizes)]))
    return lines
