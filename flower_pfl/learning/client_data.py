"""A client's local data: its own shard, or its part of the pooled dataset.

Which one a client gets is decided here, above the two modules that know how:
:mod:`flower_pfl.learning.data` (the pooled dataset, its partition, the tensors) and
:mod:`flower_pfl.learning.shards` (one site's shard written by ``flower-pfl partition``, checked
against the run's settings).  A node's ``data-root`` holding a shard manifest is read as
that shard and never falls back to the pooled set; any other ``data-root`` is read as the
dataset's folder instead of ``data.root``.  With ``data.dataset: site`` the ``data-root``
is the site's own folder or file (:mod:`flower_pfl.learning.site_data`): no pool at all.
A pooled client's images are row numbers into the shared uint8 map, normalised per batch
(:class:`flower_pfl.learning.data.NormalizedImages`),
so the per-process cache holds index arrays and labels, not float32 images.

Device residency (``device-resident``; :func:`resident`): on a GPU that per-batch host work
-- a gather and a normalising look-up on the CPU, then a host-to-device copy of every batch
-- is what the GPU waits for.  A resident client's images are normalised once, as one
float32 tensor (bit for bit the per-batch values), and kept with its labels on the training
device in the per-process cache, so an actor serving it again (every round, for its whole
lifetime) slices batches on the device and copies nothing.  ``auto``: resident on any
device but the CPU; ``always`` forces it on the CPU too (the bit-identity check);
``never``: the per-batch path everywhere.  Self-FL's synthetic Gaussian task stays on the
host (scalars).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import torch

from flower_pfl.learning import data, own_data, partitions, shards, site_data
from flower_pfl.learning.data import ClientData

_CACHE: dict[tuple[str, int], ClientData] = {}
MAX_CACHED = 64  # bound memory in long-lived simulation actors


def clear_cache() -> None:
    _CACHE.clear()


def resident(setting: str, device: Any) -> bool:
    """Whether a client's data is held on ``device`` (``device-resident``: auto, always,
    never): ``auto`` is resident on every device but the CPU."""
    if setting not in ("auto", "always", "never"):
        raise ValueError(f"device-resident {setting!r}: expected auto, always or never")
    if setting == "auto":
        return torch.device(device).type != "cpu"
    return setting == "always"


def dense(x: Any) -> torch.Tensor:
    """``x`` as one float32 tensor: a :class:`~flower_pfl.learning.data.NormalizedImages`
    normalised whole (the same bits its batches have), a tensor as it is."""
    return x.tensor() if isinstance(x, data.NormalizedImages) else x


def on_device(loaded: ClientData, device: Any) -> ClientData:
    """``loaded`` with its images and labels as tensors on ``device`` (one copy each)."""
    device = torch.device(device)
    return replace(loaded, x_train=dense(loaded.x_train).to(device),
                   y_train=loaded.y_train.to(device),
                   x_test=dense(loaded.x_test).to(device),
                   y_test=loaded.y_test.to(device))


def load_client_data(cfg: Mapping[str, Any], partition_id: int,
                     root_override: str | None = None, device: Any = None) -> ClientData:
    """Local train/test data of client ``partition_id`` (cached per process).

    ``root_override`` (the node's ``data-root``): a dataset folder (read instead of
    ``data.root``), or a shard folder holding a ``manifest.json``, whose shard is loaded and
    checked against ``cfg``.  ``device`` (the client's training device): when
    ``cfg["device-resident"]`` makes it :func:`resident`, the cached copy lives there
    (:func:`on_device`), normalised once."""
    host = load_host_data(cfg, partition_id, root_override)
    if device is None or host.task != "classification" or \
            not resident(cfg.get("device-resident", "auto"), device):
        return host
    key = (partitions.partition_key(cfg) + str(root_override) + f"@{device}", partition_id)
    if key not in _CACHE:
        if len(_CACHE) > MAX_CACHED:
            _CACHE.clear()
        _CACHE[key] = on_device(host, device)
    return _CACHE[key]


def load_host_data(cfg: Mapping[str, Any], partition_id: int,
                   root_override: str | None = None) -> ClientData:
    """:func:`load_client_data` on the host: images normalised per batch (cached)."""
    key = (partitions.partition_key(cfg) + str(root_override), partition_id)
    if key in _CACHE:
        return _CACHE[key]
    dataset = cfg["data.dataset"]
    if not 0 <= partition_id < cfg["clients"]:
        raise data.DataError(f"partition-id {partition_id} is outside [0, {cfg['clients']})")
    if dataset == "synthetic-gaussian":
        loaded = data.synthetic_client_data(cfg, partition_id)
    elif dataset == site_data.SITE:  # this site's own folder or file, nothing else
        loaded = site_data.load_site(cfg, partition_id, root_override)
    elif root_override and shards.is_shard_folder(root_override):
        loaded = shards.load_shard(root_override, cfg, partition_id)  # never the pooled set
    else:
        root = root_override or cfg["data.root"]
        x, y = data.load_pooled(dataset, root, cfg.get("cache-dir"), own_data.settings_of(cfg))
        part = partitions.get_partition(cfg, y, root)
        tr, te = part.train[partition_id], part.test[partition_id]
        loaded = ClientData(data.rows_of(x, tr, dataset), torch.from_numpy(y[tr]),
                            data.rows_of(x, te, dataset), torch.from_numpy(y[te]),
                            data.NUM_CLASSES[dataset])
    if len(_CACHE) > MAX_CACHED:
        _CACHE.clear()
    _CACHE[key] = loaded
    return loaded
