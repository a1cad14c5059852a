"""Per-site data: each site (a hospital, a device) trains on its own folder or file, and
there is no central pool anywhere (``data.dataset: site``; docs/own-data.md).

A site's data is the path its SuperNode was given (``flower-pfl supernode --data PATH``,
the node's ``data-root``), or, in a simulation on one machine, ``<data.root>/<partition-id>``
(a folder, or a file ``<partition-id>.csv|.parquet|.npz``):

* a folder: an image folder, one subfolder per class (``PATH/<class>/<image>``), read by
  :func:`~flower_pfl.learning.source_readers.read_imagefolder`; with ``train/`` and
  ``test/`` (or ``val/``...) split folders, those ARE the site's local split;
* a file: a table (CSV, Parquet: ``data.features`` names the columns, so every site reads
  the same columns in the same order; NPZ: arrays ``x``, ``y`` by default).

What must be the same at every site comes from the run's configuration, never from one
site's data: ``data.classes`` (class names in class order: label ``data.classes[i]`` is
class i), ``data.input-shape`` (``[C, H, W]`` images, ``[F]`` a table) and a fixed
``data.normalize`` (``none`` or ``[[mean, ...], [std, ...]]``; ``auto`` would differ per
site).  :func:`config_problems` refuses a run without them (the config's data checks: every
launcher, ``flower-pfl submit`` included); :func:`read_site` refuses, on the node, a site
whose labels are not among ``data.classes``, whose samples' shape is not
``data.input-shape`` (greyscale images in a 3-channel run become RGB, R = G = B; colour
images in a 1-channel run are refused), or which holds no samples.

The local split (no split folders): the site's samples shuffled with
``numpy.random.default_rng([seed, partition-id])`` and split by ``data.split``
(:func:`~flower_pfl.learning.splits.split_local`, stratified by default,
``data.test-fraction``), the train part capped at ``data.max-train-samples``.  A site
reads only its own path; nothing of another site is opened.  numpy only at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from flower_pfl.learning.data_common import DataError
from flower_pfl.learning.own_data import SourceInfo

SITE = "site"
TABLE_SUFFIXES = (".csv", ".parquet", ".npz")
TRAIN_DIRS = ("train", "training")
TEST_DIRS = ("test", "testing", "val", "valid", "validation")
#: keys a per-site run must declare (the same at every site)
DECLARED = ("data.classes", "data.input-shape")
#: partition keys that cut a pool: there is none
POOL_KEYS = ("data.partition-by", "data.partition-file", "data.subsample")


class SiteError(DataError):
    """A site's own data cannot serve this run; the message names the path and the key."""


# ----------------------------------------------------------------- the run's declaration
def config_problems(values: Mapping[str, Any]) -> list[str]:
    """One line per problem of a ``data.dataset: site`` run's declaration (no file read):
    :data:`DECLARED` missing, ``data.normalize: auto``, a normalisation or
    ``data.image-size`` that does not fit ``data.input-shape``, a pool's partition key."""
    problems = []
    why = ("data.dataset = 'site' (each node's own data, no central pool) needs {key}: "
           "{what}, the same for every site, since no site's data may decide it")
    classes, shape = values.get("data.classes"), values.get("data.input-shape")
    if not classes:
        problems.append(why.format(key="'data.classes'", what="the list of class names "
                                   "(folder names / label values) in class order"))
    if not shape:
        problems.append(why.format(key="'data.input-shape'", what="one sample's shape, [C, H, "
                                   "W] for images (C 1 or 3) or [F] for a table's features"))
    norm = values.get("data.normalize", "auto")
    if norm == "auto":
        problems.append("'data.normalize' = 'auto' computes the mean and std of the data, which "
                        "would differ from site to site with data.dataset = 'site'; give "
                        "[[mean, ...], [std, ...]] (one per channel or feature) or none")
    elif isinstance(norm, list) and shape and len(norm[0]) != shape[0]:
        unit = "channels" if len(shape) == 3 else "features"
        problems.append(f"'data.normalize' gives {len(norm[0])} mean(s) but 'data.input-shape' "
                        f"= {list(shape)} has {shape[0]} {unit}")
    size = values.get("data.image-size")
    if size is not None and shape and (len(shape) != 3 or shape[1:] != [size, size]):
        problems.append(f"'data.image-size' = {size} does not fit 'data.input-shape' = "
                        f"{list(shape)} (images are resized to size x size: set the shape "
                        f"to [C, {size}, {size}], or image-size to null)")
    if values.get("data.partition") in ("natural", "file"):
        problems.append(f"data.partition = {values['data.partition']!r} cuts a pooled dataset; "
                        f"with data.dataset = 'site' each site's own data is its client")
    problems += [f"'{key}' = {values[key]!r} cuts a pooled dataset; with data.dataset = 'site' "
                 f"there is none: set it to null" for key in POOL_KEYS if values.get(key)]
    return problems


def declared_problems(values: Mapping[str, Any]) -> list[str]:
    """Problems of ``data.classes`` / ``data.input-shape`` whatever the source: set where
    nothing reads them (``data.input-shape``: not ``site``; ``data.classes``: a built-in
    name; a pooled source of your own takes it as its class order), or malformed."""
    from flower_pfl.learning.sources import BUILTIN

    out = []
    dataset = values["data.dataset"]
    if values.get("data.classes") is not None and dataset in BUILTIN:
        out.append(f"'data.classes' = {values['data.classes']!r} orders your own data's "
                   f"classes, not the built-in data.dataset = {dataset!r}'s")
    if values.get("data.input-shape") is not None and dataset != SITE:
        out.append(f"'data.input-shape' = {values['data.input-shape']!r} is read only with "
                   f"data.dataset = 'site' (per-site data); other sources infer it from "
                   f"their data")
    names = [str(c) for c in values.get("data.classes") or []]
    if len(set(names)) != len(names):
        out.append(f"'data.classes' = {values['data.classes']!r} names a class twice")
    return out


def site_info(values: Mapping[str, Any]) -> SourceInfo:
    """The :class:`~flower_pfl.learning.own_data.SourceInfo` the run declares (what the model
    and every site's tensors follow)."""
    shape = tuple(int(s) for s in values["data.input-shape"])
    norm = values["data.normalize"]
    width = shape[0]
    mean, std = ((0.0,) * width, (1.0,) * width) if norm == "none" else \
        (tuple(float(v) for v in norm[0]), tuple(float(v) for v in norm[1]))
    classes = tuple(str(c) for c in values["data.classes"])
    return SourceInfo(shape, len(classes), classes, "image" if len(shape) == 3 else "table",
                      mean, std)


def register(values: Mapping[str, Any]) -> SourceInfo:
    """Make :func:`site_info` what this process knows of ``site`` (model shape, classes,
    normalisation: :func:`flower_pfl.learning.own_data.register`)."""
    from flower_pfl.learning import own_data

    info = site_info(values)
    own_data.register(SITE, info)
    return info


# ------------------------------------------------------------------------ one site
def site_path(values: Mapping[str, Any], partition_id: int, data_root: str | None) -> Path:
    """Where site ``partition_id``'s data is: the node's ``data_root``, else (a simulation)
    ``<data.root>/<partition_id>`` or ``<data.root>/<partition_id>.<csv|parquet|npz>``."""
    if data_root:
        return Path(data_root).expanduser()
    root = values.get("data.root")
    if not root:
        raise SiteError(f"client {partition_id} has no data of its own: start its SuperNode "
                        f"with --data <its folder or file> (a simulation: set data.root to a "
                        f"folder holding <partition-id>/ or <partition-id>.csv per site)")
    base = Path(root).expanduser() / str(partition_id)
    files = [base.with_suffix(s) for s in TABLE_SUFFIXES if base.with_suffix(s).is_file()]
    return files[0] if not base.exists() and len(files) == 1 else base


def local_problem(path: str | Path) -> str | None:
    """Why a site's ``path`` cannot be its data, judged without the run's configuration (the
    SuperNode's start): it must exist, be a folder holding files or a non-empty table
    file.  None: it may be."""
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix.lower() not in TABLE_SUFFIXES:
            return f"a file must be a table ({', '.join(TABLE_SUFFIXES)})"
        return None if p.stat().st_size > 0 else "the file is empty (no samples)"
    if not p.is_dir():
        return "no such folder or file"
    if not any(f.is_file() for f in p.rglob("*")):
        return ("the folder holds no samples (an image folder needs one subfolder per class "
                "with its images)")
    return None


@dataclass
class SiteSamples:
    """One site's samples: ``x`` uint8 ``(N, C, H, W)`` or float32 ``(N, F)``, ``y`` int64
    ``(N,)`` indices into ``data.classes``, ``is_test`` bool ``(N,)`` from split folders
    (None: the split is made, :func:`split_site`)."""

    x: np.ndarray
    y: np.ndarray
    is_test: np.ndarray | None


def read_site(path: str | Path, values: Mapping[str, Any]) -> SiteSamples:
    """Read and check one site's ``path`` against the run's declaration (module docstring).
    Cached in ``<cache-dir>/pooled`` by what the files are (:func:`own_data.load_own`).
    Raises :class:`SiteError` naming the path and the key."""
    from flower_pfl.learning import own_data

    path = Path(path).expanduser().resolve()
    where = f"this site's data {path}"
    problem = local_problem(path)
    if problem:
        raise SiteError(f"{where}: {problem}")
    table = path.is_file()
    feats = values.get("data.features")
    if table and path.suffix.lower() != ".npz" and not feats:
        raise SiteError(f"{where}: a per-site table needs 'data.features' (the feature columns, "
                        f"so every site reads the same ones in the same order)")
    settings = {"data.root": None, "data.image-size": values.get("data.image-size"),
                "data.features": [feats] if isinstance(feats, str) else feats,
                "data.label": values.get("data.label"), "data.partition-by": None,
                "data.normalize": "none", "cache-dir": values.get("cache-dir"),
                "min-classes": 1}
    spec = f"{'table' if table else 'imagefolder'}:{path}"
    try:
        x, y, columns = own_data.load_own(spec, settings)
    except DataError as exc:
        raise SiteError(f"{where}: {exc}") from exc
    own = own_data.info(spec).classes
    declared = [str(c) for c in values["data.classes"]]
    unknown = [c for c in own if c not in declared]
    if unknown:
        raise SiteError(f"{where} holds class(es) {unknown} that are not in 'data.classes' = "
                        f"{declared} (a site may hold any subset of the run's classes)")
    x = _fit_shape(np.asarray(x), [int(s) for s in values["data.input-shape"]], where)
    y = np.array([declared.index(c) for c in own], dtype=np.int64)[np.asarray(y)]
    return SiteSamples(x, y, _split_folders(columns.get("path"), where))


def _fit_shape(x: np.ndarray, shape: list[int], where: str) -> np.ndarray:
    """``x`` whose samples are ``shape`` (greyscale to RGB where 3 channels are declared);
    else SiteError naming ``data.input-shape``."""
    image = x.dtype == np.uint8 and x.ndim == 4
    got = list(x.shape[1:]) if image else [int(np.prod(x.shape[1:]))]
    if image and len(shape) == 3 and got[0] == 1 and shape[0] == 3:
        x, got = np.repeat(x, 3, axis=1), [3, *got[1:]]
    if got == shape:
        return x if image else x.reshape(len(x), -1)
    what = (f"images of shape {got} (C, H, W)" if image else f"{got[0]} features per sample")
    hint = ("" if not image else " (a colour site in a greyscale run: convert its images)"
            if got[0] == 3 and shape[0] == 1 else " (data.image-size resizes every site's "
            "images to one size)")
    raise SiteError(f"{where} holds {what}, but 'data.input-shape' = {shape}{hint}")


def _split_folders(paths: np.ndarray | None, where: str) -> np.ndarray | None:
    """``is_test`` of an image folder with split folders (None: none there)."""
    if paths is None or not len(paths):
        return None
    top = np.array([Path(str(p)).parts[0].lower() for p in paths])
    if not np.isin(top, TRAIN_DIRS + TEST_DIRS).all():
        return None
    is_test = np.isin(top, TEST_DIRS)
    if is_test.all() or not is_test.any():
        raise SiteError(f"{where} has split folders but no {'train' if is_test.all() else 'test'}"
                        f" samples: give both train/ and test/, or neither (data.split then "
                        f"makes the split)")
    return is_test


def split_site(samples: SiteSamples, values: Mapping[str, Any], partition_id: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) row indices of ``samples`` (sorted): its split folders, else the seeded
    split of the module docstring.  SiteError where either would be empty."""
    n = len(samples.y)
    if samples.is_test is not None:
        tr, te = np.flatnonzero(~samples.is_test), np.flatnonzero(samples.is_test)
        cap = values.get("data.max-train-samples")
        if cap is not None:
            tr = np.random.default_rng([values["seed"], partition_id]).permutation(tr)[:cap]
    else:
        if n < 2:
            raise SiteError(f"site {partition_id} holds {n} sample(s): 2 are needed (a train "
                            f"and a test one)")
        shuffled = np.random.default_rng([values["seed"], partition_id]).permutation(n)
        from flower_pfl.learning.splits import split_local

        tr, te = split_local(shuffled, samples.y[shuffled], values["data.test-fraction"],
                             values.get("data.split", "stratified"))
        if values.get("data.max-train-samples") is not None:
            tr = tr[:values["data.max-train-samples"]]
    return np.sort(tr), np.sort(te)


def load_site(values: Mapping[str, Any], partition_id: int, data_root: str | None) -> Any:
    """Client ``partition_id``'s :class:`~flower_pfl.learning.data.ClientData` from its own
    data only (:func:`site_path`, :func:`read_site`, :func:`split_site`), normalised with the
    run's declared ``data.normalize``."""
    import torch

    from flower_pfl.learning import data

    register(values)
    samples = read_site(site_path(values, partition_id, data_root), values)
    tr, te = split_site(samples, values, partition_id)
    x, y = samples.x, samples.y
    return data.ClientData(data.to_tensor(x[tr], SITE), torch.from_numpy(y[tr]),
                           data.to_tensor(x[te], SITE), torch.from_numpy(y[te]),
                           len(values["data.classes"]))


def describe(path: str | Path, values: Mapping[str, Any], partition_id: int) -> str:
    """One line on the site's data as this run sees it (read and checked):
    ``N train + M test samples of classes [...]``.  Raises SiteError."""
    samples = read_site(path, values)
    tr, te = split_site(samples, values, partition_id)
    names = [str(c) for c in values["data.classes"]]
    held = [names[c] for c in np.unique(samples.y)]
    return f"{len(tr)} train + {len(te)} test samples of classes {held}"
