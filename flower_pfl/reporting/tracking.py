"""Experiment tracking: a run's per-round numbers as TensorBoard event files.

``tracking: tensorboard`` in the run YAML (or ``flower-pfl run --tensorboard DIR``) makes
the run's :class:`~flower_pfl.reporting.results.ResultsWriter` -- in the ServerApp process,
where rounds are recorded -- hand every record to a :class:`TensorBoardTracker` as well:

* per evaluated round (step = the round): ``personalized/mean``, ``/weighted_mean``,
  ``/worst10``, ``/top10``, ``/worst5``, ``/std``, ``/best_mean`` (BMTA so far) and the
  same under ``global/`` where the strategy has a global model; ``loss/personalized_test``
  (the clients' test loss, weighted by test samples); histograms
  ``clients/personalized_<metric>`` (and ``clients/global_<metric>``) of the per-client
  numbers;
* per trained round: ``loss/train`` (mean of the clients' ``train_loss``) and every numeric
  measure the strategy wrote to ``server.csv`` under ``server/``.

One run per folder: ``<results>/tensorboard`` by default, ``<tracking-dir>/<run name>``
with ``tracking-dir`` (a bench cell: ``<tracking-dir>/<setting>/<strategy>/seed-<s>``).  A
resumed run purges the rounds it repeats (the writer's ``purge_step``).  TensorBoard is an
optional dependency (``flower-pfl[tensorboard]``; :func:`require` names the extra before
anything starts); ``wandb sync <event folder>`` uploads the events to W&B.

Choices left open: accuracies are logged as fractions, as rounds.csv holds them (equal to
float32 precision); NaN measures (e.g. FedACS' selection share in round 1) are skipped.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:  # torch is imported when the first record is written
    from torch.utils.tensorboard import SummaryWriter

MISSING = ("tracking: tensorboard needs the TensorBoard package, which is not installed in "
           "this environment: pip install 'flower-pfl[tensorboard]' (or pip install "
           "tensorboard), or set tracking: none")
#: rounds.csv's held-out newcomer columns (flower_pfl/newcomers.py ``newcomer_stats``)
NEWCOMER_KEYS = ("newcomers_before_mean", "newcomers_after_mean", "participation_gap",
                 "adaptation_gain")
STATS = ("mean", "weighted_mean", "worst10_mean", "top10_mean", "worst5_mean", "std", "bmta")


class TrackingError(RuntimeError):
    """Tracking was asked for but cannot work (the message says how to fix it)."""


def enabled(values: Mapping[str, Any]) -> bool:
    return values.get("tracking") not in (None, "none")


def available() -> bool:
    """Whether TensorBoard's writer can be imported."""
    try:
        import tensorboard  # noqa: F401 - no types; only present?
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        return False
    return True


def require(values: Mapping[str, Any]) -> None:
    """Raise :class:`TrackingError` where tracking is on and its package is missing."""
    if enabled(values) and not available():
        raise TrackingError(MISSING)


def run_label(results_dir: Path) -> str:
    """A run's name under ``tracking-dir``: its folder's name; a bench cell
    (``.../runs/<setting>/<strategy>/seed-<s>``) is ``<setting>/<strategy>/seed-<s>``, so
    that a bench's cells do not share one folder."""
    parts = Path(results_dir).parts
    if len(parts) >= 4 and parts[-4] == "runs" and parts[-1].startswith("seed-"):
        return "/".join(parts[-3:])
    return parts[-1]


def event_dir(values: Mapping[str, Any], results_dir: Path) -> Path:
    """Where a run's event files go: ``<tracking-dir>/<run label>`` or
    ``<results>/tensorboard``."""
    results_dir = Path(results_dir)
    if values.get("tracking-dir"):
        return Path(values["tracking-dir"]).expanduser().resolve() / run_label(results_dir)
    return results_dir / "tensorboard"


def logdir_hint(values: Mapping[str, Any], results_dir: Path) -> Path:
    """The folder to give ``tensorboard --logdir`` to see this run beside its siblings."""
    if values.get("tracking-dir"):
        return Path(values["tracking-dir"]).expanduser().resolve()
    return event_dir(values, results_dir)


def _finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


class TensorBoardTracker:
    """Writes one run's records as TensorBoard events (opened at the first record)."""

    def __init__(self, folder: Path, metric: str = "accuracy") -> None:
        require({"tracking": "tensorboard"})
        self.folder = Path(folder)
        self.metric = metric
        self.writer: SummaryWriter | None = None

    def _open(self, step: int) -> SummaryWriter:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.folder.mkdir(parents=True, exist_ok=True)
            # purge_step: a resumed run drops the events of the rounds it runs again
            self.writer = SummaryWriter(str(self.folder), purge_step=step, flush_secs=10)
        return self.writer

    def scalar(self, tag: str, value: Any, step: int) -> None:
        v = _finite(value)
        if v is not None:
            self._open(step).add_scalar(tag, v, step)

    def round(self, row: Mapping[str, Any], clients: Sequence[Mapping[str, Any]]) -> None:
        """An evaluated round: ``row`` as written to rounds.csv, ``clients`` its
        clients.csv rows."""
        step = int(row["round"])
        writer = self._open(step)
        for model, prefix in (("personal", "personalized"), ("global", "global")):
            for stat in STATS:
                key = f"{model}_{stat}"
                if key in row:
                    name = {"worst10_mean": "worst10", "top10_mean": "top10",
                            "worst5_mean": "worst5", "bmta": "best_mean"}.get(stat, stat)
                    self.scalar(f"{prefix}/{name}", row[key], step)
        for key in NEWCOMER_KEYS:  # held-out newcomers (docs/newcomers.md)
            if _finite(row.get(key)) is not None:
                self.scalar(f"newcomers/{key}", float(row[key]), step)
        m = self.metric
        for column, tag in ((m, f"clients/personalized_{m}"),
                            (f"global_{m}", f"clients/global_{m}")):
            values = [float(c[column]) for c in clients if _finite(c.get(column)) is not None]
            if values:
                writer.add_histogram(tag, np.asarray(values), step)
        weights = [float(c.get("num-test", 1)) for c in clients if "loss" in c]
        losses = [float(c["loss"]) for c in clients if "loss" in c]
        if losses and sum(weights) > 0:
            self.scalar("loss/personalized_test", np.average(losses, weights=weights), step)
        writer.flush()

    def fit(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """A round's accepted uploads (fit.csv rows): the mean train loss."""
        losses = [v for r in rows if (v := _finite(r.get("train_loss"))) is not None]
        if rows and losses:
            self.scalar("loss/train", float(np.mean(losses)), int(rows[0]["round"]))

    def server(self, server_round: int, values: Mapping[str, Any]) -> None:
        """The strategy's server.csv row of a round: every numeric measure."""
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                continue
            self.scalar(f"server/{key}", value, server_round)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None


def open_tracker(values: Mapping[str, Any], results_dir: Path,
                 metric: str) -> TensorBoardTracker | None:
    """The run's tracker (None: tracking off); raises :class:`TrackingError` where it is on
    and TensorBoard is missing.  ``metric``: the writer's
    (:func:`flower_pfl.reporting.metric_kind.metric_of`; handed over, not imported: the writer
    imports this module)."""
    if not enabled(values):
        return None
    return TensorBoardTracker(event_dir(values, results_dir), metric)
