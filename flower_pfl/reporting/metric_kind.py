"""What a run's per-client metric is, decided here only: :func:`metric_of` names it
(``accuracy``, or the synthetic Gaussian task's ``mse``), :func:`lower_is_better` gives its
direction, :func:`run_metric` reads a run's on disk.  The results writer's BMTA (the best
per-round mean so far: min for an error), the console, compare and the bench tables all
follow it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from flower_pfl.reporting.run_files import read_rows, read_values


def metric_of(values: Mapping[str, Any]) -> str:
    """What a run's per-client numbers are, from its configuration ``values`` (dotted
    keys): ``accuracy``, or ``mse`` (lower is better) for the synthetic Gaussian task."""
    return "mse" if values.get("data.dataset") == "synthetic-gaussian" else "accuracy"


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of ``metric`` is better: an error (``mse``), not an accuracy."""
    return metric == "mse"


def run_metric(run_dir: Path) -> str:
    """The metric of a run on disk: :func:`metric_of` its ``config.json``; a run without one
    (a cell copied by hand): the metric column its ``clients.csv`` wrote (the clients name
    the column by :func:`metric_of`), else ``accuracy``."""
    if (Path(run_dir) / "config.json").is_file():
        return metric_of(read_values(run_dir))
    rows = read_rows(run_dir, "clients")
    return "mse" if rows and "mse" in rows[0] else "accuracy"
