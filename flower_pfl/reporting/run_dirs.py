"""Where a run's results folder is: ``<output-dir>/<run-name>/``, and never one that holds a
run already.  The folder's files: :mod:`flower_pfl.reporting.results`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from flower_pfl.learning.sources import display_name  # imagefolder:/a/b -> imagefolder-b

if TYPE_CHECKING:
    from flower_pfl.config import RunConfig


def default_results_dir(cfg: RunConfig) -> Path:
    """``<output-dir>/<run-name>`` (a run without a name: strategy, dataset, partition (none
    for per-site data) and the start time); a relative output dir resolves against the cwd."""
    part = "" if cfg["data.dataset"] == "site" else f"{cfg['data.partition']}-"
    name = cfg["run-name"] or (f"{cfg.strategy}-{display_name(cfg['data.dataset'])}-"
                               f"{part}{time.strftime('%Y%m%d-%H%M%S')}")
    return (Path(cfg["output-dir"]).expanduser().resolve() / name)


def new_results_dir(cfg: RunConfig) -> Path:
    """The folder of a new run: :func:`default_results_dir`, never one that holds a run.
    Without a ``run-name`` the name carries the start second, and a second run in that
    second gets ``-2``, ``-3``, ...; a ``run-name`` whose folder holds a run already
    (summary.json) raises FileExistsError naming the key: its CSV files would be appended
    to, two runs' rows mixed.  (``--resume`` continues a run in its own folder instead.)"""
    path = default_results_dir(cfg)
    if cfg["run-name"]:
        if (path / "summary.json").exists():
            raise FileExistsError(f"'run-name' = {cfg['run-name']}: {path} holds a run "
                                  f"already (summary.json); choose another run-name, remove "
                                  f"it, or continue it with --resume")
        return path
    base, k = path, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return path
