"""Datasets, partitions and per-client train/test splits.

How a client's data is made (deterministic in ``seed``):

1. The dataset's official train and test sets are pooled (FMNIST: 70,000 images) and,
   if ``data.subsample`` is set, a seeded random subset is kept.
2. The pooled labels are split among ``clients`` partitions: ``iid``, ``dirichlet``
   (alpha) and ``pathological`` (k classes per client) through flwr-datasets'
   partitioners; ``practical`` (FedAMP section 7 groups) by :func:`practical_partition`.
3. Each client's samples are shuffled and split into a local train and a local test
   part (``data.test-fraction``), so each client's test set follows its own label
   distribution (as in FedAMP, pFedMe and pFedBreD). ``data.max-train-samples`` then caps
   the local train part (FedACS' 50-sample setting); the test part is kept.

The index lists are cached on disk (``<cache-dir>/partitions/<hash>.npz``) and in
memory, so hundreds of clients do not re-partition every round.

Fashion-MNIST loads offline from the Debian package ``dataset-fashion-mnist`` (or any
directory holding its four IDX ``.gz`` files, ``data.root``); other datasets go through
torchvision's downloader and fail with a clear error offline.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import shutil
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

DEBIAN_FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

NUM_CLASSES = {"fmnist": 10, "mnist": 10, "emnist": 62, "cifar10": 10, "cifar100": 100}
# (mean, std) per channel, used to normalise images to roughly zero mean / unit variance.
NORMALIZATION = {
    "fmnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "emnist": ((0.1751,), (0.3332,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


class DataError(RuntimeError):
    """A dataset could not be loaded or partitioned; the message says what to do."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("FLOWER_PFL_CACHE", Path.home() / ".cache" / "flower-pfl"))


# --------------------------------------------------------------------------- loading
_POOLED: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def _prepare_fmnist_raw(root: Path, cache: Path) -> Path:
    """Return a torchvision root whose FashionMNIST/raw holds the four un-gzipped IDX files.

    Looks in ``root`` if given (never elsewhere: a ``data.root`` or node ``data-root``
    without the files must not silently read the Debian copy instead), else in the Debian
    package's directory; gunzips the ``.gz`` files into the cache (torchvision refuses the
    Debian copies' checksums).
    """
    search = [root, root / "FashionMNIST" / "raw"] if root else [DEBIAN_FMNIST_DIR]
    for directory in search:
        if all((directory / f).is_file() for f in FMNIST_FILES):
            return directory.parent.parent if directory.name == "raw" else _link_raw(directory,
                                                                                     cache)
        if all((directory / f"{f}.gz").is_file() for f in FMNIST_FILES):
            return _gunzip_raw(directory, cache)
    raise FileNotFoundError("Fashion-MNIST IDX files not found")


def _raw_target(directory: Path, cache: Path) -> Path:
    """The torchvision root (``<it>/FashionMNIST/raw``) for the IDX files of ``directory``:
    one per source directory, so a ``data.root`` holding another copy (a subset, say) never
    reads the files an earlier run unpacked from the Debian package's copy."""
    tag = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:12]
    return cache / "torchvision" / f"fmnist-{tag}"


def _gunzip_raw(directory: Path, cache: Path) -> Path:
    root = _raw_target(directory, cache)
    target = root / "FashionMNIST" / "raw"
    target.mkdir(parents=True, exist_ok=True)
    for name in FMNIST_FILES:
        if not (target / name).is_file():
            fd, tmp = tempfile.mkstemp(dir=target)
            try:
                with gzip.open(directory / f"{name}.gz", "rb") as src, \
                        os.fdopen(fd, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
                os.unlink(tmp)
                raise DataError(f"dataset file {directory / (name + '.gz')} is corrupt or "
                                f"truncated ({exc}); reinstall or re-download it") from exc
            os.replace(tmp, target / name)  # atomic: concurrent Ray actors may race here
    return root


def _link_raw(directory: Path, cache: Path) -> Path:
    root = _raw_target(directory, cache)
    target = root / "FashionMNIST" / "raw"
    target.mkdir(parents=True, exist_ok=True)
    for name in FMNIST_FILES:
        if not (target / name).exists():
            shutil.copyfile(directory / name, target / name)
    return root


def load_pooled(dataset: str, root: str | None = None, cache_dir: str | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Pooled (train + test) images as uint8 ``(N, C, H, W)`` and int64 labels."""
    key = (dataset, root, cache_dir)
    if key in _POOLED:
        return _POOLED[key]
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    # A numpy copy of the pooled arrays: later processes (a deployed SuperNode starts a new
    # ClientApp process per message) load it in ~0.1 s without importing torchvision.
    tag = hashlib.sha256(f"{dataset}|{root}".encode()).hexdigest()[:12]
    npz = cache / "pooled" / f"{dataset}-{tag}.npz"
    if npz.is_file():
        try:
            with np.load(npz) as z:
                _POOLED[key] = (z["x"], z["y"])
            return _POOLED[key]
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
            npz.unlink(missing_ok=True)  # a corrupt cache copy: rebuild it from the dataset
    root_path = Path(root).expanduser() if root else None
    if root_path is not None and not root_path.is_dir():
        raise DataError(f"data.root = {root} is not a directory (it should hold the dataset's "
                        f"files)")
    from torchvision import datasets as tvd  # heavy import, only where data is needed

    if dataset == "fmnist":
        try:
            tv_root = _prepare_fmnist_raw(root_path, cache)
        except FileNotFoundError:
            tv_root = None
        if tv_root is None:
            parts = _download(tvd.FashionMNIST, root_path or cache / "torchvision", dataset)
        else:
            try:
                parts = [tvd.FashionMNIST(str(tv_root), train=t, download=False)
                         for t in (True, False)]
            except (RuntimeError, ValueError, OSError) as exc:
                raise DataError(f"the Fashion-MNIST IDX files under {tv_root} are corrupt "
                                f"({type(exc).__name__}: {exc}); delete them and reinstall "
                                f"'dataset-fashion-mnist' or point data.root at good copies"
                                ) from exc
    else:
        cls = {"mnist": tvd.MNIST, "cifar10": tvd.CIFAR10, "cifar100": tvd.CIFAR100}.get(dataset)
        if dataset == "emnist":
            cls = lambda r, train, download: tvd.EMNIST(  # noqa: E731 - called like a dataset class
                r, split="byclass", train=train, download=download)
        if cls is None:
            raise DataError(f"unknown image dataset '{dataset}'")
        parts = _download(cls, root_path or cache / "torchvision", dataset)
    xs, ys = [], []
    for part in parts:
        x = np.asarray(part.data.numpy() if hasattr(part.data, "numpy") else part.data)
        x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)  # -> N, C, H, W
        xs.append(x.astype(np.uint8))
        ys.append(np.asarray(part.targets, dtype=np.int64))
    pooled = (np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys))
    npz.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=npz.parent, suffix=".npz")
    with os.fdopen(fd, "wb") as fh:
        np.savez(fh, x=pooled[0], y=pooled[1])
    os.replace(tmp, npz)  # atomic: concurrent processes may race here
    _POOLED[key] = pooled
    return pooled


def _download(cls, root: Path, dataset: str) -> list:
    try:
        return [cls(str(root), train=t, download=True) for t in (True, False)]
    except Exception as exc:  # URLError, RuntimeError, ... all mean the same to a user
        hint = (" Install the Debian package 'dataset-fashion-mnist' or set data.root to a "
                "directory holding its IDX .gz files." if dataset == "fmnist" else
                f" Put torchvision's '{dataset}' files under data.root ({root}) or run online.")
        raise DataError(f"could not load dataset '{dataset}' ({type(exc).__name__}: {exc})."
                        + hint) from exc


# ------------------------------------------------------------------------ partitions
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


def _draw(pools: dict, classes: np.ndarray, count: int, rng: np.random.Generator) -> list[int]:
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


def _flwr_partition(labels: np.ndarray, cfg: Mapping[str, Any], seed: int) -> list[np.ndarray]:
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
    else:
        # "deterministic": client i holds classes i, i+1, ..., i+k-1 (mod C), so every class
        # is used and each client has exactly k classes.
        part = fp.PathologicalPartitioner(num_partitions=n, partition_by="label",
                                          num_classes_per_partition=cfg["data.classes-per-client"],
                                          class_assignment_mode="deterministic", seed=seed)
    part.dataset = Dataset.from_dict({"label": labels.tolist(),
                                      "idx": np.arange(len(labels)).tolist()})
    try:
        return [np.asarray(part.load_partition(i)["idx"], dtype=np.int64) for i in range(n)]
    except ValueError as exc:
        raise DataError(f"partition '{kind}' failed for {n} clients on {len(labels)} samples: "
                        f"{exc}. Lower 'clients', 'data.min-samples' or raise 'data.alpha'."
                        ) from exc


@dataclass(frozen=True)
class Partition:
    """Per-client index arrays into the pooled dataset (possibly subsampled)."""

    train: list[np.ndarray]
    test: list[np.ndarray]


PARTITION_KEYS = ("data.dataset", "data.partition", "data.alpha", "data.classes-per-client",
                  "data.groups", "data.dominant-share", "data.max-train-samples",
                  "data.subsample", "data.test-fraction", "data.min-samples", "clients", "seed")


def make_partition(labels: np.ndarray, cfg: Mapping[str, Any]) -> Partition:
    """Split pooled ``labels`` into per-client train/test index arrays (pure, seeded)."""
    seed = cfg["seed"]
    rng = np.random.default_rng([seed, 0x5EED])
    pool = np.arange(len(labels))
    if cfg["data.subsample"] and cfg["data.subsample"] < len(labels):
        pool = np.sort(rng.choice(len(labels), cfg["data.subsample"], replace=False))
    sub = labels[pool]
    if cfg["data.partition"] == "practical":
        parts = practical_partition(sub, cfg["clients"], cfg["data.groups"],
                                    cfg["data.dominant-share"], rng, cfg["data.min-samples"])
    else:
        parts = _flwr_partition(sub, cfg, seed)
    train, test = [], []
    cap = cfg["data.max-train-samples"]
    for client, local in enumerate(parts):
        if len(local) < 2:
            raise DataError(f"client {client} received {len(local)} samples; lower 'clients' "
                            f"or raise 'data.subsample'")
        local = pool[rng.permutation(local)]
        n_test = max(1, int(round(len(local) * cfg["data.test-fraction"])))
        tr, te = local[n_test:], local[:n_test]
        if cap is not None:
            tr = tr[:cap]
        if len(tr) == 0 or len(te) == 0:
            raise DataError(f"the partition leaves client {client} with {len(tr)} training and "
                            f"{len(te)} test sample(s); lower 'clients' or raise 'data.subsample'")
        train.append(np.sort(tr))
        test.append(np.sort(te))
    return Partition(train, test)


def partition_key(cfg: Mapping[str, Any]) -> str:
    blob = json.dumps({k: cfg[k] for k in PARTITION_KEYS}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


_PARTITIONS: dict[str, Partition] = {}


def get_partition(cfg: Mapping[str, Any], labels: np.ndarray) -> Partition:
    """Cached :func:`make_partition` (memory, then ``<cache>/partitions/<hash>.npz``)."""
    key = partition_key(cfg)
    if key in _PARTITIONS:
        return _PARTITIONS[key]
    cache = Path(cfg.get("cache-dir") or default_cache_dir()) / "partitions"
    path = cache / f"{key}.npz"
    if path.is_file():
        with np.load(path) as z:
            part = Partition(np.split(z["train"], z["train_ends"][:-1]),
                             np.split(z["test"], z["test_ends"][:-1]))
    else:
        part = make_partition(labels, cfg)
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".npz")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, train=np.concatenate(part.train), test=np.concatenate(part.test),
                     train_ends=np.cumsum([len(p) for p in part.train]),
                     test_ends=np.cumsum([len(p) for p in part.test]))
        os.replace(tmp, path)  # atomic: several Ray actors may build it at once
    _PARTITIONS[key] = part
    return part


# -------------------------------------------------------------------- client tensors
@dataclass
class ClientData:
    """One client's local data as float tensors, ready for mini-batching.

    ``task`` is "classification" (images; metric: accuracy) or "gaussian-mean" (Self-FL's
    synthetic task: y holds the scalar samples z, the loss is the Gaussian negative
    log-likelihood sum (theta - z)^2 / (2 noise^2), the metric the squared error of the
    client's parameter to its true theta_m).
    """

    x_train: Any
    y_train: Any
    x_test: Any
    y_test: Any
    num_classes: int
    task: str = "classification"
    noise_sq: float = 1.0
    theta_true: float = 0.0

    @property
    def metric(self) -> str:
        return "accuracy" if self.task == "classification" else "mse"

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.y_test.shape[0])


def to_tensor(x: np.ndarray, dataset: str):
    """uint8 images ``(N, C, H, W)`` as float tensors normalised with ``dataset``'s mean/std."""
    import torch

    mean, std = NORMALIZATION[dataset]
    t = torch.from_numpy(x).float().div_(255.0)
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)
    return (t - m) / s




# ------------------------------------------------------- Self-FL synthetic Gaussian
@dataclass(frozen=True)
class GaussianTruth:
    """Ground truth of the two-level Gaussian task (Self-FL section 2.1 / G.1)."""

    theta: np.ndarray  # theta_m, per client
    num_samples: np.ndarray  # N_m
    z: list[np.ndarray]  # training samples per client
    z_test: list[np.ndarray]
    sigma0_sq: float
    noise_sq: float

    @property
    def z_mean(self) -> np.ndarray:
        """The local estimates theta_m^(L) = z_m (sample means)."""
        return np.array([zi.mean() for zi in self.z])

    @property
    def sigma_sq(self) -> np.ndarray:
        """sigma_m^2 = noise^2 / N_m: the variance of the local estimate z_m."""
        return self.noise_sq / self.num_samples


def gaussian_truth(cfg: Mapping[str, Any]) -> GaussianTruth:
    """theta_m ~ N(theta0, sigma0^2); client m holds N_m samples z ~ N(theta_m, noise^2)."""
    m = cfg["clients"]
    rng = np.random.default_rng([cfg["seed"], 0x5E1F])
    theta = cfg["data.synthetic-theta0"] + math.sqrt(cfg["data.synthetic-sigma0-sq"]) * \
        rng.standard_normal(m)
    lo, hi = cfg["data.synthetic-samples"], cfg["data.synthetic-samples-max"] or \
        cfg["data.synthetic-samples"]
    sizes = rng.integers(lo, hi + 1, size=m)
    noise = math.sqrt(cfg["data.synthetic-noise-sq"])
    z, z_test = [], []
    for i in range(m):
        r = np.random.default_rng([cfg["seed"], 0x5E1F, i])
        z.append(theta[i] + noise * r.standard_normal(sizes[i]))
        z_test.append(theta[i] + noise * r.standard_normal(sizes[i]))
    return GaussianTruth(theta, sizes, z, z_test, float(cfg["data.synthetic-sigma0-sq"]),
                         float(cfg["data.synthetic-noise-sq"]))


def synthetic_client_data(cfg: Mapping[str, Any], partition_id: int) -> ClientData:
    import torch

    truth = gaussian_truth(cfg)
    z, zt = truth.z[partition_id], truth.z_test[partition_id]
    return ClientData(torch.zeros(len(z), 1), torch.from_numpy(z).float(),
                      torch.zeros(len(zt), 1), torch.from_numpy(zt).float(), 1,
                      task="gaussian-mean", noise_sq=truth.noise_sq,
                      theta_true=float(truth.theta[partition_id]))


def input_shape(dataset: str) -> tuple[int, int, int]:
    return (3, 32, 32) if dataset in ("cifar10", "cifar100") else (1, 28, 28)
