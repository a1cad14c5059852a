"""Datasets and client tensors (the partitions: :mod:`flower_pfl.learning.partitions`; which data a
client gets: :mod:`flower_pfl.learning.client_data`).

How a client's data is made (deterministic in ``seed``):

1. The dataset's official train and test sets are pooled (FMNIST: 70,000 images) and,
   if ``data.subsample`` is set, a seeded random subset is kept.
2. The pooled labels are split among ``clients`` partitions: ``iid``, ``dirichlet``
   (alpha) and ``pathological`` (k classes per client) through flwr-datasets'
   partitioners; ``practical`` (FedAMP section 7 groups) by :func:`practical_partition`.
3. Each client's samples are shuffled and split into a local train and a local test
   part (``data.test-fraction``; per class by default, ``data.split``:
   :mod:`flower_pfl.learning.splits`), so each client's test set follows its own label
   distribution (as in FedAMP, pFedMe and pFedBreD). ``data.max-train-samples`` then caps
   the local train part (FedACS' 50-sample setting); the test part is kept.
4. A client's images stay row numbers of the pooled uint8 array, which every process maps
   read-only from one cache file, and are normalised per batch (:class:`NormalizedImages`,
   the same float32 values as normalising them all at once): no process holds a float32
   copy of them.

The index lists are cached on disk (``<cache-dir>/partitions/<hash>.npz``) and in
memory, so hundreds of clients do not re-partition every round.

Fashion-MNIST loads offline from the Debian package ``dataset-fashion-mnist`` (or any
directory holding its four IDX ``.gz`` files, ``data.root``); other datasets go through
torchvision's downloader and fail with a clear error offline.  Your own data (an image
folder, a table, a Hugging Face dataset, ``module:function``): :mod:`.sources`,
:mod:`.own_data`, docs/own-data.md.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import shutil
import zlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from flower_pfl.atomic import atomic_write
from flower_pfl.learning.data_common import DEBIAN_FMNIST_DIR as DEBIAN_FMNIST_DIR
from flower_pfl.learning.data_common import NORMALIZATION as NORMALIZATION
from flower_pfl.learning.data_common import TABLES as _TABLES
from flower_pfl.learning.data_common import DataError as DataError
from flower_pfl.learning.data_common import default_cache_dir as default_cache_dir

FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")



class _Classes(dict[str, int]):
    """The built-in datasets' class counts; another ``data.dataset`` (a source of
    :mod:`flower_pfl.learning.sources`) answers with its inferred count
    (:func:`flower_pfl.learning.own_data.info`; ``get`` does not look it up)."""

    def __missing__(self, dataset: str) -> int:
        from flower_pfl.learning import own_data

        return own_data.info(dataset).num_classes


NUM_CLASSES = _Classes({"fmnist": 10, "mnist": 10, "emnist": 62, "cifar10": 10,
                        "cifar100": 100})
#: pooled (train + test) samples of each dataset as torchvision ships it (EMNIST: the
#: "byclass" split); a data.root may hold fewer
POOLED_SIZE = {"fmnist": 70_000, "mnist": 70_000, "emnist": 814_255, "cifar10": 60_000,
               "cifar100": 60_000}
# --------------------------------------------------------------------------- loading
_POOLED: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}


def clear_cache() -> None:
    """Forget this process's open pooled arrays and data fingerprints: the next
    :func:`load_pooled` re-opens the cache file (as a new process would)."""
    from flower_pfl.learning import own_data

    _POOLED.clear()
    own_data.clear_cache()


def _prepare_fmnist_raw(root: Path | None, cache: Path) -> Path:
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


def _missing_raw(directory: Path, cache: Path) -> tuple[Path, Path, list[str]]:
    """(torchvision root, its raw folder -- created --, the IDX files not yet there)."""
    root = _raw_target(directory, cache)
    target = root / "FashionMNIST" / "raw"
    target.mkdir(parents=True, exist_ok=True)
    return root, target, [name for name in FMNIST_FILES if not (target / name).is_file()]


def _gunzip_raw(directory: Path, cache: Path) -> Path:
    root, target, missing = _missing_raw(directory, cache)
    for name in missing:
        try:  # atomic: concurrent Ray actors may race here
            with gzip.open(directory / f"{name}.gz", "rb") as src:
                atomic_write(target / name, partial(shutil.copyfileobj, src), mode="wb")
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise DataError(f"dataset file {directory / (name + '.gz')} is corrupt or "
                            f"truncated ({exc}); reinstall or re-download it") from exc
    return root


def _link_raw(directory: Path, cache: Path) -> Path:
    root, target, missing = _missing_raw(directory, cache)
    for name in missing:
        shutil.copyfile(directory / name, target / name)
    return root


def load_pooled(dataset: str, root: str | None = None, cache_dir: str | None = None,
                settings: Mapping[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pooled (train + test) images as uint8 ``(N, C, H, W)`` (a table source: float32
    ``(N, F)`` features) and int64 labels.

    Both come memory-mapped read-only from a ``.npy`` copy in the cache: the pages are the
    page cache's, shared by every process of a run (launcher, Ray actors) instead of one
    private copy each; a client's slice (``x[indices]``) is its own array.  The copy's name
    hashes what the data are (:func:`flower_pfl.learning.sources.fingerprint`): changed
    files are read again.  A source that is not a built-in name is read by
    :func:`flower_pfl.learning.own_data.load_own` with ``settings`` (the run's ``data.*``
    values; default: only ``root`` and ``cache_dir``).  Raises DataError."""
    from flower_pfl.learning import sources

    if dataset not in POOLED_SIZE:
        from flower_pfl.learning import own_data

        own = dict(settings or {}, **{"data.root": root, "cache-dir": cache_dir})
        x, y, _ = own_data.load_own(dataset, own)
        return x, y
    key = (dataset, root, cache_dir)
    if key in _POOLED:
        return _POOLED[key]
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    # A numpy copy of the pooled arrays: later processes (a deployed SuperNode starts a new
    # ClientApp process per message) map it in ~1 ms without importing torchvision.
    what = sources.fingerprint(dataset, root)
    tag = hashlib.sha256(f"{dataset}|{root}|{what}".encode()).hexdigest()[:12]
    files = {part: cache / "pooled" / f"{dataset}-{tag}-{part}.npy" for part in ("x", "y")}
    if all(f.is_file() for f in files.values()):
        try:
            _POOLED[key] = pooled_copy = tuple(np.load(files[p], mmap_mode="r") for p in "xy")
            if len(pooled_copy[0]) == len(pooled_copy[1]):
                return _POOLED[key]
        except (OSError, ValueError, EOFError):
            pass
        _POOLED.pop(key, None)
        for f in files.values():  # a corrupt cache copy: rebuild it from the dataset
            f.unlink(missing_ok=True)
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
    files["x"].parent.mkdir(parents=True, exist_ok=True)
    for part, array in zip("xy", pooled):  # atomic: concurrent processes may race here
        atomic_write(files[part], partial(np.save, arr=array), mode="wb")
    del pooled, xs, parts
    _POOLED[key] = tuple(np.load(files[p], mmap_mode="r") for p in "xy")
    return _POOLED[key]


def _download(cls: Callable[..., Any], root: Path, dataset: str) -> list[Any]:
    try:
        return [cls(str(root), train=t, download=True) for t in (True, False)]
    except Exception as exc:  # URLError, RuntimeError, ... all mean the same to a user
        hint = (" Install the Debian package 'dataset-fashion-mnist' or set data.root to a "
                "directory holding its IDX .gz files." if dataset == "fmnist" else
                f" Put torchvision's '{dataset}' files under data.root ({root}) or run online.")
        raise DataError(f"could not load dataset '{dataset}' ({type(exc).__name__}: {exc})."
                        + hint) from exc


# -------------------------------------------------------------------- client tensors
@dataclass
class ClientData:
    """One client's local data, ready for mini-batching: ``x[idx]`` and ``x[a:b]`` give
    float tensors (a :class:`NormalizedImages` for the pooled dataset's images, a tensor
    otherwise), ``y`` a tensor.

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
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.y_test.shape[0])


if TYPE_CHECKING:  # (imported where data is needed: torch is a heavy import)
    import torch


def to_tensor(x: np.ndarray, dataset: str) -> torch.Tensor:
    """uint8 images ``(N, C, H, W)`` as float tensors normalised with ``dataset``'s mean/std."""
    import torch

    if x.dtype != np.uint8:  # a table source's features: standardised per feature
        from flower_pfl.learning import own_data

        source = own_data.info(dataset)
        flat = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).reshape(len(x), -1)
        return (flat - torch.tensor(source.mean, dtype=torch.float32)) / \
            torch.tensor(source.std, dtype=torch.float32)
    mean, std = NORMALIZATION[dataset]
    t = torch.from_numpy(x).float().div_(255.0)
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)
    return (t - m) / s


def normalization_table(dataset: str) -> np.ndarray:
    """float32 ``(C, 256)``: what :func:`to_tensor` makes of each byte value in channel c,
    computed by :func:`to_tensor` itself (element by element the same operations, so a
    look-up gives the same bits)."""
    if dataset not in _TABLES:
        channels = len(NORMALIZATION[dataset][0])
        byte = np.repeat(np.arange(256, dtype=np.uint8).reshape(256, 1, 1, 1), channels, 1)
        _TABLES[dataset] = np.ascontiguousarray(
            to_tensor(byte, dataset).numpy().reshape(256, channels).T)
    return _TABLES[dataset]


class NormalizedImages:
    """A client's images: rows ``rows`` of the pooled uint8 array, normalised per batch.

    ``x[idx]`` (an index tensor or array, a slice, an int) is the float32 tensor
    ``to_tensor(pooled[rows[idx]])`` bit for bit, made by a table look-up per byte
    (:func:`normalization_table`).  The pooled array is the read-only memory map every
    process shares (:func:`load_pooled`), so a client holds only its row numbers: no
    float32 copy of its images (4 bytes per pixel, ~220 MB in an actor that has served all
    FMNIST clients), for one gather and one look-up per batch."""

    def __init__(self, pooled: np.ndarray, rows: np.ndarray, dataset: str) -> None:
        self.pooled, self.rows = pooled, np.asarray(rows, dtype=np.int64)
        self.plain = pooled.view(np.ndarray)  # the same pages, without memmap's per-call cost
        self.table = normalization_table(dataset)
        self.channel = np.arange(len(self.table)).reshape(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.rows), *self.pooled.shape[1:])

    def __getitem__(self, key: torch.Tensor | np.ndarray | slice | int) -> torch.Tensor:
        import torch

        if isinstance(key, torch.Tensor):
            key = key.numpy()
        images = self.plain.take(self.rows[key], axis=0)  # take: ~2x faster than [] here
        if len(self.table) == 1:
            return torch.from_numpy(self.table[0].take(images))
        return torch.from_numpy(self.table[self.channel, images])

    def tensor(self) -> torch.Tensor:
        """All of them as one float32 tensor (a copy)."""
        return self[:]


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


def input_shape(dataset: str) -> tuple[int, ...]:
    """One sample's shape: ``(C, H, W)`` for images, ``(F,)`` for a table source (a source's:
    inferred, :func:`flower_pfl.learning.own_data.info`)."""
    if dataset in POOLED_SIZE or dataset == "synthetic-gaussian":
        return (3, 32, 32) if dataset in ("cifar10", "cifar100") else (1, 28, 28)
    from flower_pfl.learning import own_data

    return own_data.info(dataset).shape


def rows_of(pooled: np.ndarray, rows: np.ndarray, dataset: str) -> Any:
    """A client's samples ``rows`` of ``pooled``: :class:`NormalizedImages` for uint8
    images, else a float32 tensor ``(len(rows), F)`` (:func:`to_tensor`)."""
    if pooled.dtype == np.uint8:
        return NormalizedImages(pooled, rows, dataset)
    return to_tensor(pooled[rows], dataset)
