"""A client's local data: its own shard, or its part of the pooled dataset.

Which one a client gets is decided here, above the two modules that know how:
:mod:`flower_pfl.learning.data` (the pooled dataset, its partition, the tensors) and
:mod:`flower_pfl.learning.shards` (one site's shard written by ``flower-pfl partition``, checked
against the run's settings).  A node's ``data-root`` holding a shard manifest is read as
that shard and never falls back to the pooled set; any other ``data-root`` is read as the
dataset's folder instead of ``data.root``.  A pooled client's images are row numbers into
the shared uint8 map, normalised per batch (:class:`flower_pfl.learning.data.NormalizedImages`),
so the per-process cache holds index arrays and labels, not float32 images.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from flower_pfl.learning import data, partitions, shards
from flower_pfl.learning.data import ClientData

_CACHE: dict[tuple[str, int], ClientData] = {}
MAX_CACHED = 64  # bound memory in long-lived simulation actors


def clear_cache() -> None:
    _CACHE.clear()


def load_client_data(cfg: Mapping[str, Any], partition_id: int,
                     root_override: str | None = None) -> ClientData:
    """Local train/test data of client ``partition_id`` (cached per process).

    ``root_override`` (the node's ``data-root``): a dataset folder (read instead of
    ``data.root``), or a shard folder holding a ``manifest.json``, whose shard is loaded and
    checked against ``cfg``."""
    key = (partitions.partition_key(cfg) + str(root_override), partition_id)
    if key in _CACHE:
        return _CACHE[key]
    dataset = cfg["data.dataset"]
    if not 0 <= partition_id < cfg["clients"]:
        raise data.DataError(f"partition-id {partition_id} is outside [0, {cfg['clients']})")
    if dataset == "synthetic-gaussian":
        loaded = data.synthetic_client_data(cfg, partition_id)
    elif root_override and shards.is_shard_folder(root_override):
        loaded = shards.load_shard(root_override, cfg, partition_id)  # never the pooled set
    else:
        x, y = data.load_pooled(dataset, root_override or cfg["data.root"], cfg.get("cache-dir"))
        part = partitions.get_partition(cfg, y)
        tr, te = part.train[partition_id], part.test[partition_id]
        loaded = ClientData(data.NormalizedImages(x, tr, dataset), torch.from_numpy(y[tr]),
                            data.NormalizedImages(x, te, dataset), torch.from_numpy(y[te]),
                            data.NUM_CLASSES[dataset])
    if len(_CACHE) > MAX_CACHED:
        _CACHE.clear()
    _CACHE[key] = loaded
    return loaded
