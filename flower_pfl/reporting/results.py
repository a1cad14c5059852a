"""Writing a run's results folder, ``<output-dir>/<run-name>/``
(:func:`flower_pfl.reporting.run_dirs.new_results_dir`).

* ``config.json``   -- the validated configuration of the run
* ``rounds.csv``    -- a row per evaluation round: statistics of the personalized (and the
                       global model's) metric over ALL clients that answered, how many
                       did (``clients_evaluated``) and that round's fit (``fit_accepted``
                       of ``fit_sampled``; :mod:`flower_pfl.reporting.coverage`)
* ``clients.csv``   -- a row per client per evaluation round (``device`` of its last fit;
                       a held-out newcomer's row: ``newcomer`` 1, ``newcomer_before`` /
                       ``newcomer_after``, docs/newcomers.md;
                       ``trained`` 0 = no accepted fit yet: its metric is of a model it
                       never trained a round on; summary.json ``untrained_evaluated`` says
                       which)
* ``fit.csv``       -- a row per accepted upload (:meth:`ResultsWriter.log_fit`): round,
                       partition-id, num-examples, the device it trained on, the client's
                       numeric fit metrics; ``failures.csv`` a row per failed message
* ``server.csv``    -- per-round server-side quantities a strategy logs (e.g. FedACS delta)
* ``summary.json``  -- everything above plus BMTA and ``coverage``, rewritten after every
                       round; ``status`` running, completed, stopped or failed (then
                       ``error``: type and message; :meth:`ResultsWriter.record_outcome`,
                       :func:`mark_failed`)
* ``<name>.npy/.png``, ``curves.png``, ``tensorboard/`` -- a strategy's matrices, the
                       run's curves, TensorBoard events (:mod:`flower_pfl.reporting.tracking`)

Everything is appended/rewritten as it happens (a crash loses nothing already measured).
The folder's name: :mod:`flower_pfl.reporting.run_dirs`.  Reading a run back:
:mod:`flower_pfl.reporting.run_files` (the files), :mod:`~flower_pfl.reporting.run_readings`
(last round, loss, never-trained clients), :mod:`~flower_pfl.reporting.coverage`; the metric
and its direction: :mod:`flower_pfl.reporting.metric_kind`.  BMTA = the best per-round mean
so far (min for an error).
Open choice: a CSV gains a column only by being rewritten with the union of the columns.
"""

from __future__ import annotations

import csv
import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from flower_pfl import raynode
from flower_pfl.atomic import atomic_write_text
from flower_pfl.learning import devices
from flower_pfl.learning.metrics import STAT_KEYS, best_mean
from flower_pfl.newcomers import held_out
from flower_pfl.reporting import tracking
from flower_pfl.reporting.coverage import coverage_record
from flower_pfl.reporting.heatmaps import matrix_title, true_groups, write_heatmap_png
from flower_pfl.reporting.metric_kind import lower_is_better, metric_of
from flower_pfl.reporting.run_files import read_json
from flower_pfl.reporting.run_readings import loss_by_round, untrained

#: statistics of the trained clients only in rounds.csv (``personal_trained_<key>``)
TRAINED_KEYS = ("mean", "weighted_mean", "worst10_mean")
#: characters of a failed run's error message kept in summary.json
MAX_ERROR = 4000


class ResultsWriter:
    def __init__(self, out_dir: Path, config: Mapping[str, Any]) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rounds: list[dict[str, Any]] = []
        self.server_rows: list[dict[str, Any]] = []
        self.started = time.time()
        self.status = "running"
        self.config = dict(config)
        # the run's metric (accuracy; mse for the synthetic task: lower is better)
        self.metric = metric_of(self.config.get("values", {}))
        self.lower_is_better = lower_is_better(self.metric)
        self.last_clients: list[dict[str, Any]] = []  # the last evaluated round's rows
        self.extra: dict[str, Any] = {}  # set_summary: end-of-run entries of summary.json
        # an earlier launch's evaluated rounds (a run about to resume): kept until
        # adopt_earlier_rounds(), so a resume that fails does not leave a summary without them
        self._earlier_rounds = _summary_rounds(self.dir / "summary.json")
        _write_json(self.dir / "config.json", config)
        self.tracker = tracking.open_tracker(self.config.get("values", {}), self.dir,
                                             self.metric)
        self.write_summary()

    def log_round(self, server_round: int, personal: Mapping[str, float],
                  global_: Mapping[str, float] | None, clients: Sequence[Mapping[str, Any]],
                  lower_is_better: bool | None = None,
                  trained: Mapping[str, float] | None = None,
                  trained_clients: int | None = None,
                  newcomers: Mapping[str, float] | None = None) -> None:
        """One evaluation round.  ``lower_is_better`` (optional) is the caller's direction; it
        must be the writer's own (:func:`metric_of` the configuration), never a second rule.
        ``trained``: the same statistics over the clients that have trained (``trained`` 1
        in their rows; None: none has), ``trained_clients`` how many they are; ``newcomers``:
        the held-out newcomers' columns (:func:`flower_pfl.newcomers.newcomer_stats`: before
        and after means, participation gap, adaptation gain; ``personal_*`` are then the
        participants')."""
        if lower_is_better is not None and lower_is_better != self.lower_is_better:
            raise ValueError(f"round {server_round}: the caller says lower_is_better="
                             f"{lower_is_better}, the run's metric {self.metric!r} says "
                             f"{self.lower_is_better}")
        row: dict[str, Any] = {"round": server_round,
                               "elapsed_s": round(time.time() - self.started, 3)}
        row.update({f"personal_{k}": personal[k] for k in STAT_KEYS})
        if global_ is not None:
            row.update({f"global_{k}": global_[k] for k in STAT_KEYS})
        # coverage: k of the n participants (a held-out newcomer's row is evaluated apart)
        row["clients_evaluated"] = sum(1 for c in clients if not c.get("newcomer"))
        fit = next((r for r in reversed(self.server_rows) if r.get("round") == server_round),
                   None)
        if fit is not None and "fit_ok" in fit:  # this round's fit (server.csv: every round)
            row["fit_accepted"] = int(fit["fit_ok"])
            row["fit_sampled"] = int(fit.get("sampled", int(fit["fit_ok"])
                                             + int(fit.get("fit_failed", 0))))
        for key in PRIVACY_KEYS:  # ε after this round (docs/privacy.md)
            if fit is not None and key in fit:
                row[key] = fit[key]
        if trained_clients is not None:
            row["personal_trained_clients"] = int(trained_clients)
            for k in TRAINED_KEYS:
                row[f"personal_trained_{k}"] = trained[k] if trained else float("nan")
        if newcomers is not None:
            row.update(newcomers)
        self.rounds.append(row)
        row["personal_bmta"] = self._best("personal_mean")
        append_csv(self.dir / "rounds.csv", row)
        append_csv(self.dir / "clients.csv", [{"round": server_round, **c} for c in clients])
        self.last_clients = [dict(c) for c in clients]
        self.write_summary()
        if self.tracker is not None:
            self.tracker.round(row, clients)

    def set_summary(self, key: str, value: Any) -> None:
        """An end-of-run entry of ``summary.json`` (the mechanism's count, the clients that
        never trained), kept across later rewrites."""
        self.extra[key] = value
        self.write_summary()

    def _best(self, key: str) -> float:
        """BMTA: best per-round mean so far (max; min for an error metric such as mse)."""
        values = [{"mean": -r[key] if self.lower_is_better else r[key]} for r in self.rounds]
        best = best_mean(values)
        return -best if self.lower_is_better else best

    def log_server(self, server_round: int, values: Mapping[str, Any]) -> None:
        row = {"round": server_round, **values}
        self.server_rows.append(row)
        append_csv(self.dir / "server.csv", row)
        if self.tracker is not None:
            self.tracker.server(server_round, values)

    def log_table(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append rows to ``<name>.csv`` (e.g. FedACS' peers per client per round)."""
        append_csv(self.dir / f"{name}.csv", rows)

    def log_fit(self, server_round: int,
                uploads: Sequence[tuple[int, int, Mapping[str, Any]]]) -> None:
        """``fit.csv``: a row per accepted upload (partition-id, num_examples, metrics): the
        device it trained on, its Ray node (empty outside Ray), then the client's numeric fit
        metrics."""
        rows = [{"round": server_round, "partition-id": pid, "num-examples": num_examples,
                 **devices.select(metrics), **raynode.select(metrics),  # and its Ray node
                 **{k: v for k, v in sorted(metrics.items())
                    if k != "partition-id" and k not in devices.KEYS
                    and isinstance(v, (int, float))}}
                for pid, num_examples, metrics in uploads]
        append_csv(self.dir / "fit.csv", rows)
        if self.tracker is not None:
            self.tracker.fit(rows)

    def log_failures(self, server_round: int, phase: str,
                     failures: Sequence[tuple[int, str]]) -> None:
        """``failures.csv``: a row per (partition-id, reason) of a failed ``phase`` message."""
        append_csv(self.dir / "failures.csv", [{"round": server_round, "phase": phase,
                                                "partition-id": pid, "reason": reason}
                                               for pid, reason in failures])

    def save_matrix(self, name: str, matrix: np.ndarray, labels: Sequence[int] | None = None
                    ) -> None:
        np.save(self.dir / f"{name}.npy", np.asarray(matrix))
        if labels is not None:
            np.save(self.dir / f"{name}_ids.npy", np.asarray(labels))
        values = self.config.get("values", {})
        server_round = int(self.rounds[-1]["round"]) if self.rounds else None
        write_heatmap_png(self.dir / f"{name}.png", np.asarray(matrix, dtype=np.float64),
                          groups=true_groups(values),
                          title=matrix_title(name, str(values.get("strategy", "")),
                                             server_round),
                          untrained=untrained(self.last_clients))

    def finish(self, status: str, error: BaseException | None = None) -> None:
        """The run's end: ``status`` (completed, stopped, failed) and, for a failed run,
        ``error`` recorded as ``{"type", "message"}`` in summary.json."""
        self.status = status
        if error is not None:
            self.extra["error"] = error_record(error)
        self.write_summary()
        if self.tracker is not None:
            self.tracker.close()
        if self.rounds:
            try:
                self.write_curves()
            except Exception as exc:  # a figure must never turn a finished run into a failure
                (self.dir / "curves.error.txt").write_text(f"{type(exc).__name__}: {exc}\n")

    def adopt_earlier_rounds(self) -> None:
        """Before a resume: summary.json lists the rounds the earlier launch recorded
        (the checkpoint's own list replaces them once it is read), so a resume that fails
        ends ``failed`` beside the rounds that did run, not beside an empty list."""
        if not self.rounds and self._earlier_rounds:
            self.rounds = list(self._earlier_rounds)
            self.write_summary()

    @contextmanager
    def record_outcome(self) -> Iterator[None]:
        """Around everything a run does after this writer exists (the ServerApp's round
        loop, the in-process loop): an exception that ends the run ends it ``failed`` with
        its type and message in summary.json, whatever the status was (a run that raises
        after its last round did not complete); KeyboardInterrupt ends a running one
        ``stopped``.  The exception goes on."""
        try:
            yield
        except KeyboardInterrupt:
            if self.status == "running":
                self.finish("stopped")
            raise
        except BaseException as exc:
            self.finish("failed", exc)
            raise

    def write_curves(self) -> Path:
        """``curves.png``: this run's accuracy (personalized mean, worst-10%, top-10%; the
        global model's mean) vs round, beside its loss."""
        from flower_pfl.reporting import plots  # matplotlib: imported only when a figure is drawn

        values = self.config.get("values", {})
        return plots.run_curves(self.rounds, self.dir / "curves.png",
                                metric=self.metric,
                                loss=loss_by_round(self.dir),
                                title=f"{values.get('strategy', '')} on "
                                f"{values.get('data.dataset', '')}/"
                                f"{values.get('data.partition', '')}, "
                                f"{values.get('clients', '')} clients")

    def coverage(self) -> dict[str, Any] | None:
        """How many clients the rounds held so far cover (:func:`coverage_record` of them);
        None without a configured client count."""
        values = self.config.get("values", {})
        clients = values.get("clients")
        if clients is None:
            return None
        return coverage_record(
            int(clients), {int(r["round"]): int(r["clients_evaluated"])
                           for r in self.rounds if "clients_evaluated" in r},
            [c["partition-id"] for c in self.last_clients if not c.get("newcomer")]
            if self.last_clients else None,
            self.server_rows, held_out(values) if values.get("newcomers.clients") else ())

    def write_summary(self) -> None:
        """Rewrite ``summary.json`` from the rounds held (after every round; after a resume
        has rewound them)."""
        summary: dict[str, Any] = {"status": self.status, "rounds": self.rounds,
                                   "server": self.server_rows,
                                   "elapsed_s": round(time.time() - self.started, 3),
                                   **self.extra}
        coverage = self.coverage()
        if coverage is not None:
            summary["coverage"] = coverage
        spent = privacy_spent(self.server_rows)
        if spent:
            summary["privacy"] = spent
        if self.rounds:
            last = self.rounds[-1]
            summary["final"] = {k: v for k, v in last.items() if k != "round"}
            summary["bmta"] = self._best("personal_mean")
            if "global_mean" in last:
                summary["global_bmta"] = self._best("global_mean")
        _write_json(self.dir / "summary.json", summary)


#: server.csv's privacy measures copied into rounds.csv: client-level ε (and to whoever knows
#: the schedule), sample-level's largest per-client ε (docs/privacy.md)
PRIVACY_KEYS = ("epsilon", "epsilon_known_schedule", "epsilon_max")


def privacy_spent(server_rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """summary.json's ``privacy``: each privacy measure's value after the last round that
    recorded it, and that round ({} without DP)."""
    out: dict[str, Any] = {}
    for row in server_rows:
        for key in PRIVACY_KEYS:
            if key in row:
                out[key], out["after_round"] = row[key], row["round"]
    return out


def error_record(error: BaseException | str) -> dict[str, str]:
    """``{"type": ..., "message": ...}`` of what ended a run (up to MAX_ERROR characters)."""
    if isinstance(error, str):
        kind, message = "error", error
    else:
        kind, message = type(error).__name__, str(error)
    cut = len(message) - MAX_ERROR
    return {"type": kind, "message": message if cut <= 0
            else f"{message[:MAX_ERROR]} ... ({cut} more characters)"}


def mark_failed(run_dir: Path, error: BaseException | str) -> bool:
    """The launcher's record of a run that failed where the ServerApp could not say so
    (killed, timed out, failed before or after its rounds): ``status: failed`` and
    ``error`` in the summary.json of a run still marked ``running``.  A status the
    ServerApp wrote (its own error is the precise one) is left alone.  True: marked."""
    path = Path(run_dir) / "summary.json"
    summary = read_json(path)
    if not isinstance(summary, dict) or summary.get("status") != "running":
        return False
    summary.update(status="failed", error=error_record(error))
    _write_json(path, summary)
    return True


def _summary_rounds(path: Path) -> list[dict[str, Any]]:
    """The ``rounds`` list of an existing summary.json; [] when there is none or it cannot
    be read (a damaged file is not a reason to stop a run)."""
    summary = read_json(path)
    rounds = summary.get("rounds", []) if isinstance(summary, dict) else []
    return [dict(r) for r in rounds if isinstance(r, dict)] if isinstance(rounds, list) else []


def _write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def append_csv(path: Path, rows: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
    """Append row(s) in one write. Missing columns stay empty; only a NEW column (e.g. a
    metric that appears later) makes the file be rewritten with the union of columns."""
    rows = [dict(rows)] if isinstance(rows, Mapping) else [dict(r) for r in rows]
    if not rows:
        return
    header: list[str] = []
    if path.exists():
        with path.open() as fh:
            header = next(csv.reader(fh), [])
    fields = list(dict.fromkeys(header + [k for r in rows for k in r]))
    if header and fields != header:
        with path.open() as fh:
            rows = list(csv.DictReader(fh)) + rows
        header = []
    with path.open("a" if header else "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, restval="")
        if not header:
            w.writeheader()
        w.writerows(rows)
