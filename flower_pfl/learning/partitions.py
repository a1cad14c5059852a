"""Partitions: which pooled samples each client holds, and its local train/test split.

Deterministic in ``seed`` (see :mod:`flower_pfl.learning.data` for the whole recipe):

* the pooled labels are split among ``clients`` partitions: ``iid``, ``dirichlet`` (alpha)
  and ``pathological`` (k classes per client, every class used where ``clients * k``
  allows: :func:`pathological_classes`) through flwr-datasets' partitioners;
  ``practical`` (FedAMP section 7 groups) by :func:`practical_partition`; ``natural``
  (a column names the client) and ``file`` (the user's lists) by
  :mod:`flower_pfl.learning.fixed_partitions`;
* each client's samples are shuffled and split into a local train and a local test part
  (``data.test-fraction``; ``data.split``: per class by default,
  :mod:`flower_pfl.learning.splits`), so each client's test set follows its own label
  distribution; ``data.max-train-samples`` then caps the local train part.

The index lists are cached on disk (``<cache-dir>/partitions/<hash>.npz``) and in memory, so
hundreds of clients do not re-partition every round.  The hash (:func:`cache_key`) is of
what the data are (:func:`flower_pfl.learning.sources.fingerprint`: the source, its root,
its files' sizes and modification times; a partition file's too) and every setting that
shapes the partition (:func:`partition_key`): changed data rebuild it, never reuse it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from flower_pfl.atomic import atomic_write
from flower_pfl.learning import fixed_partitions, splits
from flower_pfl.learning.data import DataError, default_cache_dir


def practical_partition(labels: np.ndarray, num_clients: int, num_groups: int,
                        dominant_share: float, rng: np.random.Generator,
                        min_samples: int = 10) -> list[np.ndarray]:
    """FedAMP section 7 'practical non-IID' partition.

    Clients are split into ``num_groups`` contiguous groups and the classes into
    ``num_groups`` disjoint sets of dominant classes (FMNIST: {0-3}, {4-6}, {7-9} for
    three groups).  A client of group g draws ``dominant_share`` of its samples uniformly
    from g's dominant classes and the rest uniformly from the other classes.  As in the
    paper, sample counts differ by group (group g gets a share proportional to
    ``num_groups - g``), every client sees all classes, and samples are drawn without
    replacement from the pool.
    """
    classes = np.unique(labels)
    if num_groups > len(classes):
        raise DataError(f"data.groups = {num_groups} exceeds the {len(classes)} classes")
    if num_groups > num_clients:
        raise DataError(f"data.groups = {num_groups} exceeds clients = {num_clients}")
    class_sets = np.array_split(classes, num_groups)
    client_group = group_of_clients(num_clients, num_groups)
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    # Group-specific sample counts (the paper uses 1000/700/400 for its three EMNIST groups):
    # size the counts so the busiest class pool cannot run dry.
    weight = np.array([num_groups - g for g in client_group], dtype=float)
    per_class = min(len(p) for p in pools.values())
    demand = np.zeros(len(classes))
    for g in range(num_groups):
        members = weight[client_group == g].sum()
        dom = class_sets[g]
        for c in classes:
            share = dominant_share / len(dom) if c in dom else \
                (1 - dominant_share) / (len(classes) - len(dom))
            demand[np.searchsorted(classes, c)] += members * share
    scale = 0.95 * per_class / demand.max()
    sizes = np.maximum(min_samples, np.floor(weight * scale)).astype(int)
    parts = []
    for client, g in enumerate(client_group):
        dom, rest = class_sets[g], np.setdiff1d(classes, class_sets[g])
        n_dom = int(round(sizes[client] * dominant_share))
        picks = _draw(pools, dom, n_dom, rng) + _draw(pools, rest, sizes[client] - n_dom, rng)
        parts.append(np.array(picks, dtype=np.int64))
    return parts


def group_of_clients(num_clients: int, num_groups: int) -> np.ndarray:
    """Group id of each client for the practical partition (contiguous blocks)."""
    return np.concatenate([np.full(len(b), g) for g, b in
                           enumerate(np.array_split(np.arange(num_clients), num_groups))])


def _draw(pools: dict[int, list[int]], classes: np.ndarray, count: int,
          rng: np.random.Generator) -> list[int]:
    """Draw ``count`` samples uniformly over ``classes`` (round-robin on a random class order)."""
    if count <= 0 or len(classes) == 0:
        return []
    per = np.full(len(classes), count // len(classes))
    per[rng.choice(len(classes), count % len(classes), replace=False)] += 1
    out: list[int] = []
    for c, k in zip(classes, per):
        pool = pools[c]
        if len(pool) < k:
            raise DataError("not enough samples for the practical partition; lower 'clients' or "
                            "raise 'data.subsample'")
        out.extend(pool[:k])
        del pool[:k]
    return out


def assigned_indices(part: Any, first: np.ndarray, n: int) -> list[np.ndarray]:
    """Partitions 1..n-1 of a flwr-datasets partitioner whose partition 0 was ``first``.

    Each ``load_partition`` builds a Hugging Face ``Dataset`` (a deep copy of its metadata
    and a fingerprint): ~1-3 ms a client, 10-30 s at 10,000 clients.  The dataset's ``idx``
    column is ``arange``, so a partition's ``idx`` values ARE the row indices the
    partitioner assigned; where it keeps them (``_partition_id_to_indices``: the
    Dirichlet and pathological partitioners, filled by the first ``load_partition``) they
    are read from there.  Otherwise (IID's shards, another version) one ``load_partition``
    per client, as before (tests/test_partition_speed.py: both give the same arrays)."""
    table = getattr(part, "_partition_id_to_indices", None)
    if (isinstance(table, dict) and len(table) == n
            and np.array_equal(np.asarray(table.get(0, []), dtype=np.int64), first)):
        return [np.asarray(table[i], dtype=np.int64) for i in range(1, n)]
    return [np.asarray(part.load_partition(i)["idx"], dtype=np.int64) for i in range(1, n)]


def pathological_classes(num_clients: int, k: int, num_classes: int) -> list[list[int]]:
    """The class indices (into the sorted classes) each client holds in ``pathological``.

    flwr-datasets' "deterministic" rule -- client i holds classes i, i+1, ..., i+k-1 (mod
    C) -- covers every class when ``num_clients + k - 1 >= C``, and is kept there (the
    built-in configs: 100 x 2, 50 x 2, 20 x 3).  Below that it leaves classes to no client
    even where ``num_clients * k >= C`` would cover them all (6 x 2 of 10 classes: 7-9
    unused); there client i holds classes i*k, ..., i*k+k-1 (mod C), which covers every
    class.  With ``num_clients * k < C`` no rule can; the shifted one is kept.  No seed:
    the seed shuffles the samples."""
    if num_clients + k - 1 >= num_classes or num_clients * k < num_classes:
        return [[(i + j) % num_classes for j in range(k)] for i in range(num_clients)]
    return [[(i * k + j) % num_classes for j in range(k)] for i in range(num_clients)]


def covering_changed(cfg: Mapping[str, Any], num_classes: int) -> bool:
    """Whether :func:`pathological_classes` departs from flwr-datasets' rule for ``cfg``
    (a ``pathological`` partition of ``num_classes`` classes that rule under-covers)."""
    n, k = int(cfg["clients"]), int(cfg["data.classes-per-client"])
    return cfg["data.partition"] == "pathological" and n + k - 1 < num_classes <= n * k


def _pathological_partitioner(n: int, k: int, seed: int) -> Any:
    """flwr-datasets' PathologicalPartitioner ("deterministic") with the class assignment of
    :func:`pathological_classes`."""
    from flwr_datasets import partitioner as fp

    # misc: flwr_datasets ships no types, so its base class is Any to mypy
    class Covering(fp.PathologicalPartitioner):  # type: ignore[misc]
        def _determine_partition_id_to_unique_labels(self) -> None:
            super()._determine_partition_id_to_unique_labels()  # its checks and its rule
            classes = self._unique_labels
            for pid, picks in enumerate(pathological_classes(n, k, len(classes))):
                self._partition_id_to_unique_labels[pid] = [classes[c] for c in picks]

    return Covering(num_partitions=n, partition_by="label", num_classes_per_partition=k,
                    class_assignment_mode="deterministic", seed=seed)


def _subsample_hint(cfg: Mapping[str, Any], pooled: int) -> str:
    """``, or raise 'data.subsample' (now N of M)`` where a subsample is what limits."""
    sub = cfg["data.subsample"]
    return f", or raise 'data.subsample' (now {sub})" if sub and sub <= pooled else ""


def _flwr_partition(labels: np.ndarray, cfg: Mapping[str, Any], seed: int,
                    pooled: int | None = None) -> list[np.ndarray]:
    from datasets import Dataset
    from flwr_datasets import partitioner as fp

    n = cfg["clients"]
    kind = cfg["data.partition"]
    if kind == "iid":
        part = fp.IidPartitioner(num_partitions=n)
    elif kind == "dirichlet":
        part = fp.DirichletPartitioner(num_partitions=n, partition_by="label",
                                       alpha=cfg["data.alpha"],
                                       min_partition_size=cfg["data.min-samples"],
                                       self_balancing=False, seed=seed)
    else:  # each client exactly k classes, every class used where k * clients allows
        part = _pathological_partitioner(n, cfg["data.classes-per-client"], seed)
    part.dataset = Dataset.from_dict({"label": labels.tolist(),
                                      "idx": np.arange(len(labels)).tolist()})
    try:
        first = np.asarray(part.load_partition(0)["idx"], dtype=np.int64)
        return [first] + assigned_indices(part, first, n)
    except ValueError as exc:
        fix = {"dirichlet": "lower 'clients' or 'data.min-samples', raise 'data.alpha'",
               "pathological": "lower 'clients' or 'data.classes-per-client'",
               "iid": "lower 'clients'"}[kind]
        raise DataError(f"partition '{kind}' failed for {n} clients on {len(labels)} samples: "
                        f"{exc}. To fix: {fix}"
                        f"{_subsample_hint(cfg, pooled or len(labels))}.") from exc


@dataclass(frozen=True)
class Partition:
    """Per-client index arrays into the pooled dataset (possibly subsampled)."""

    train: list[np.ndarray]
    test: list[np.ndarray]


PARTITION_KEYS = ("data.dataset", "data.partition", "data.alpha", "data.classes-per-client",
                  "data.groups", "data.dominant-share", "data.max-train-samples",
                  "data.subsample", "data.test-fraction", "data.min-samples", "clients", "seed")
#: keys hashed by :func:`partition_key` only where they differ from these values (so the
#: keys of partitions made before them stay as they were: a random split, no own source)
LATER_KEYS = {"data.root": None, "data.split": "random", "data.partition-by": None,
              "data.partition-file": None, "data.image-size": None, "data.features": None,
              "data.label": None, "data.normalize": "auto", "data.classes": None}


def make_partition(labels: np.ndarray, cfg: Mapping[str, Any],
                   columns: Mapping[str, np.ndarray] | None = None) -> Partition:
    """Split pooled ``labels`` into per-client train/test index arrays (pure, seeded);
    ``columns``: the source's extra per-sample columns (``natural``: the client's column;
    ``file``: ids).  Raises DataError naming the key at fault."""
    seed = cfg["seed"]
    rng = np.random.default_rng([seed, 0x5EED])
    pool = np.arange(len(labels))
    if cfg["data.subsample"] and cfg["data.subsample"] < len(labels):
        pool = np.sort(rng.choice(len(labels), cfg["data.subsample"], replace=False))
    sub = labels[pool]
    columns = columns or {}
    kind = cfg["data.partition"]
    if kind == "natural":
        by = cfg.get("data.partition-by")
        if by not in columns:
            raise DataError(f"'data.partition-by' = {by!r}: no such column in the data "
                            f"(columns besides features and label: {sorted(columns)})")
        parts = fixed_partitions.natural_partition(columns[str(by)], cfg["clients"],
                                                   "data.partition-by")
    elif kind == "file":
        by = cfg.get("data.partition-by")
        ids = columns.get(by) if by else columns.get("path")
        parts = fixed_partitions.file_partition(cfg["data.partition-file"], len(labels),
                                                cfg["clients"], ids)
    elif kind == "practical":
        parts = practical_partition(sub, cfg["clients"], cfg["data.groups"],
                                    cfg["data.dominant-share"], rng, cfg["data.min-samples"])
    else:
        parts = _flwr_partition(sub, cfg, seed, len(labels))
    train, test = [], []
    cap = cfg["data.max-train-samples"]
    for client, local in enumerate(parts):
        if len(local) < 2:
            raise DataError(f"client {client} received {len(local)} samples (2 needed: a train "
                            f"and a test one); lower 'clients'"
                            f"{_subsample_hint(cfg, len(labels))}")
        local = pool[rng.permutation(local)]
        tr, te = splits.split_local(local, labels[local], cfg["data.test-fraction"],
                                    cfg.get("data.split", "random"))
        if cap is not None:
            tr = tr[:cap]
        if len(tr) == 0 or len(te) == 0:
            raise DataError(f"the partition leaves client {client} with {len(tr)} training and "
                            f"{len(te)} test sample(s); lower 'clients' or change "
                            f"'data.test-fraction'{_subsample_hint(cfg, len(labels))}")
        train.append(np.sort(tr))
        test.append(np.sort(te))
    return Partition(train, test)


def partition_key(cfg: Mapping[str, Any]) -> str:
    """The cache name (16 hex digits) of ``cfg``'s partition: a hash of
    :data:`PARTITION_KEYS`' values, plus a mark where :func:`pathological_classes` departs
    from the rule the older caches and shards were made with (no other key changed)."""
    from flower_pfl.learning.data import NUM_CLASSES

    blob_of = {k: cfg[k] for k in PARTITION_KEYS}
    blob_of.update({k: cfg.get(k, v) for k, v in LATER_KEYS.items() if cfg.get(k, v) != v})
    if covering_changed(cfg, NUM_CLASSES.get(cfg["data.dataset"], 0)):
        blob_of["pathological-classes"] = "every class covered"
    blob = json.dumps(blob_of, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


_PARTITIONS: dict[str, Partition] = {}


def clear_cache() -> None:
    """Forget the partitions held in memory: the next :func:`get_partition` reads the disk
    copy (or builds it)."""
    _PARTITIONS.clear()


def cache_key(cfg: Mapping[str, Any], root: str | None = None) -> str:
    """The partition's cache name: :func:`partition_key` with what the data are (the
    :func:`~flower_pfl.learning.sources.fingerprint` of ``data.dataset`` read from ``root``,
    default ``data.root``; a partition file's size and modification time)."""
    from flower_pfl.learning import sources

    what = sources.fingerprint(cfg["data.dataset"], root or cfg.get("data.root"))
    blob = f"{partition_key(cfg)}|{what}|{fixed_partitions.file_digest(cfg)}"
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def source_columns(cfg: Mapping[str, Any], root: str | None = None) -> dict[str, np.ndarray]:
    """The extra per-sample columns of ``cfg``'s own source (none for a built-in name)."""
    from flower_pfl.learning import own_data
    from flower_pfl.learning.data import POOLED_SIZE

    if cfg["data.dataset"] in POOLED_SIZE:
        return {}
    settings = dict(own_data.settings_of(cfg), **{"data.root": root or cfg.get("data.root")})
    return own_data.load_own(cfg["data.dataset"], settings)[2]


def unseen_class_clients(cfg: Mapping[str, Any], labels: np.ndarray,
                         root: str | None = None) -> dict[int, list[int]]:
    """``{client: classes}`` of the clients whose local test set holds classes their training
    set lacks (:func:`flower_pfl.learning.splits.unseen_test_classes`; cached partition)."""
    part = get_partition(cfg, labels, root)
    return splits.unseen_test_classes(part.train, part.test, labels)


def unseen_count(cfg: Mapping[str, Any]) -> int | None:
    """How many clients of ``cfg``'s run test on a class their training set lacks (the
    pooled labels and the partition from the caches; None for the synthetic task): the
    number for a run's summary."""
    from flower_pfl.learning import data, own_data

    if cfg["data.dataset"] == "synthetic-gaussian":
        return None
    _, y = data.load_pooled(cfg["data.dataset"], cfg.get("data.root"), cfg.get("cache-dir"),
                            own_data.settings_of(cfg))
    return len(unseen_class_clients(cfg, np.asarray(y)))


def get_partition(cfg: Mapping[str, Any], labels: np.ndarray, root: str | None = None
                  ) -> Partition:
    """Cached :func:`make_partition` (memory, then ``<cache>/partitions/<hash>.npz``; the
    hash: :func:`cache_key`, ``root``: where the data were read, default ``data.root``)."""
    key = cache_key(cfg, root)
    if key in _PARTITIONS:
        return _PARTITIONS[key]
    cache = Path(cfg.get("cache-dir") or default_cache_dir()) / "partitions"
    path = cache / f"{key}.npz"
    if path.is_file():
        with np.load(path) as z:
            part = Partition(np.split(z["train"], z["train_ends"][:-1]),
                             np.split(z["test"], z["test_ends"][:-1]))
    else:
        part = make_partition(labels, cfg, source_columns(cfg, root)
                              if cfg["data.partition"] in ("natural", "file") else None)
        cache.mkdir(parents=True, exist_ok=True)
        # atomic: several Ray actors may build it at once
        atomic_write(path, partial(np.savez, train=np.concatenate(part.train),
                                   test=np.concatenate(part.test),
                                   train_ends=np.cumsum([len(p) for p in part.train]),
                                   test_ends=np.cumsum([len(p) for p in part.test])), mode="wb")
    _PARTITIONS[key] = part
    return part
