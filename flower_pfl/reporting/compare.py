"""``flower-pfl compare RUN_DIR ...``: the bench's table and curves for any finished runs.

A run folder is what ``flower-pfl run`` (or a bench cell) writes: summary.json, rounds.csv,
clients.csv, config.json.  For ad-hoc comparisons outside a bench matrix this writes, into
one output folder, the bench's table (:func:`flower_pfl.reporting.tables.cell_numbers` per
run, :func:`~flower_pfl.reporting.tables.number_cells` per row: final mean, weighted,
worst-10%, top-10%, worst-5%, BMTA, global, s/round), ``table.csv``, the overlaid curves
(:func:`flower_pfl.reporting.plots.curves`, one panel per compared metric) and the
per-client distribution of the last evaluated round (``plots.distribution``).

Choices:

* Metrics are round-row keys of rounds.csv / summary.json (``personal_mean``,
  ``global_worst10_mean``, ``personal_trained_mean``, ``participation_gap``, ...): each is
  a panel, and a table column where the bench's columns do not already hold it.  Default:
  the bench's panels, and the newcomers' after mean and participation gap where a run held
  newcomers out (docs/newcomers.md).
  A metric some run did not record (``global_mean`` of ``local``) is refused, naming the
  runs and the metrics all of them share.
* Runs of an accuracy and runs of an error (mse: lower is better) are not compared.
* A run that did not complete (stopped, failed -- its error named -- or still running) is
  refused; ``allow_unfinished`` compares it at its last evaluated round, its row marked.
  A run with no evaluated round is always refused.  A completed run whose numbers cover
  fewer than all clients (a node lost, clients failed) is compared as what it is: every
  row's ``clients`` column says how many clients its final metrics cover (and its fits,
  where some failed: :func:`~flower_pfl.reporting.coverage.coverage_cell`), and the runs
  list gives its coverage line (docs/reliability.md "Coverage").
* Labels: the strategy, then every configuration key whose value differs between the runs
  (``key=value``; a hyper-parameter only between runs of the same strategy); the folder's
  name where that label would be longer than MAX_LABEL characters; the folder's name added
  where two labels coincide.  Keys that cannot change a result (where results go,
  tracking, checkpoints) never tell runs apart.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from flower_pfl.hyper import did_you_mean
from flower_pfl.learning.metrics import STAT_KEYS
from flower_pfl.reporting.coverage import coverage_cell, coverage_line, run_coverage
from flower_pfl.reporting.metric_kind import lower_is_better, run_metric
from flower_pfl.reporting.results import TRAINED_KEYS
from flower_pfl.reporting.run_files import read_json, read_summary, read_values
from flower_pfl.reporting.run_readings import last_evaluation
from flower_pfl.reporting.tables import COLUMNS, cell_numbers, number_cells, settings_line
from flower_pfl.reporting.tracking import NEWCOMER_KEYS

#: a label longer than this is replaced by the run folder's name
MAX_LABEL = 48
#: configuration keys that change no result: they never tell two runs apart
NOT_COMPARED = frozenset({"output-dir", "run-name", "tracking", "tracking-dir", "cache-dir",
                          "data.root", "checkpoint-every", "stall-timeout", "round-timeout"})
#: the metrics a comparison can draw: statistics of the clients' metric per evaluated round
METRICS = tuple([f"personal_{k}" for k in STAT_KEYS] + ["personal_bmta"]
                + [f"personal_trained_{k}" for k in TRAINED_KEYS]
                + [f"global_{k}" for k in STAT_KEYS] + list(NEWCOMER_KEYS))
DEFAULT_METRICS = ("personal_mean", "personal_worst10_mean", "global_mean")
#: the defaults added where a run held newcomers out (docs/newcomers.md)
NEWCOMER_DEFAULTS = ("newcomers_after_mean", "participation_gap")
#: a metric the bench's table already shows: its column there
IN_TABLE = {"personal_mean": "final_mean", "personal_weighted_mean": "final_weighted",
            "personal_worst10_mean": "final_worst10", "personal_top10_mean": "final_top10",
            "personal_worst5_mean": "final_worst5", "personal_bmta": "bmta",
            "global_mean": "global_final"}


class CompareError(ValueError):
    """The runs cannot be compared as asked; the message names the cause and the fix."""


@dataclass
class Run:
    """One run folder, read back."""

    dir: Path
    summary: dict[str, Any]
    values: dict[str, Any]
    hyper: dict[str, Any]
    metric: str
    numbers: dict[str, float]
    unfinished: str = ""  # why it is not a finished run ("" for a finished one)
    coverage: dict[str, Any] | None = None  # how many clients its numbers cover
    label: str = ""
    differs: list[str] = field(default_factory=list)  # key=value that tell it apart

    @property
    def strategy(self) -> str:
        return str(self.values.get("strategy") or self.dir.name)

    @property
    def rounds(self) -> list[dict[str, Any]]:
        return list(self.summary.get("rounds") or [])


def _run_folders_below(path: Path, depth: int = 3) -> list[Path]:
    """Run folders (with a summary.json) up to ``depth`` levels below ``path``."""
    found: list[Path] = []
    level = [path]
    for _ in range(depth):
        level = sorted(p for d in level for p in d.iterdir() if p.is_dir()) if level else []
        found += [p for p in level if (p / "summary.json").is_file()]
        level = [p for p in level if not (p / "summary.json").is_file()]
    return found


def not_a_run(path: Path) -> str | None:
    """Why ``path`` is not a run folder, with what to pass instead; None for a run folder."""
    if not path.exists():
        return f"{path}: no such folder"
    if not path.is_dir():
        return f"{path}: not a folder (pass a run's results folder, not one of its files)"
    if (path / "summary.json").is_file():
        return None
    runs = _run_folders_below(path)
    hint = ""
    if runs:
        shown = " ".join(str(p) for p in runs[:4]) + (" ..." if len(runs) > 4 else "")
        hint = f"; it holds {len(runs)} run folder(s): pass them, e.g. {shown}"
    return (f"{path}: not a run folder (no summary.json; a run folder is what `flower-pfl run` "
            f"writes: summary.json, rounds.csv, clients.csv, config.json){hint}")


def unfinished_reason(summary: Mapping[str, Any], planned: Any) -> str:
    """Why a run is not a finished one ("" where it is): its status, the round it got to,
    a failed run's error, the way on for a stopped one."""
    status = summary.get("status")
    if status == "completed":
        return ""
    rounds = summary.get("rounds") or []
    why = (f"status '{status}' after round {rounds[-1]['round']} of {planned or '?'}" if rounds
           else f"status '{status}'")
    error = summary.get("error")
    if isinstance(error, dict):
        why += f": {error.get('type')}: {str(error.get('message'))[:300]}"
    return why + (" (`flower-pfl run --resume` continues it)" if status == "stopped" else "")


def load_run(path: Path) -> Run:
    """One run folder, or CompareError saying why it is not one."""
    why = not_a_run(path)
    if why:
        raise CompareError(why)
    summary = read_summary(path)
    if not isinstance(summary, dict):
        raise CompareError(f"{path}: summary.json is not readable JSON (a run still writing it, "
                           f"or a damaged copy)")
    conf = read_json(path / "config.json")
    values = read_values(path)
    if not summary.get("rounds"):
        status = unfinished_reason(summary, None) or "status 'completed'"
        raise CompareError(f"{path}: no evaluated round ({status}): nothing to compare")
    numbers = cell_numbers(path, finished_only=False)
    assert numbers is not None  # it has rounds
    return Run(dir=path, summary=summary, values=values,
               hyper=dict(conf.get("hyper") or {}) if isinstance(conf, dict) else {},
               metric=run_metric(path), numbers=numbers,
               unfinished=unfinished_reason(summary, values.get("rounds")),
               coverage=run_coverage(path))


def _show(value: Any) -> str:
    return "null" if value is None else str(value)


def label_runs(runs: Sequence[Run]) -> None:
    """Set each run's ``label`` and ``differs`` (module docstring: Labels)."""
    keys = sorted({k for r in runs for k in r.values} - NOT_COMPARED - {"strategy"})
    differing = [k for k in keys if len({_show(r.values.get(k)) for r in runs}) > 1]
    for run in runs:
        same = [r for r in runs if r.strategy == run.strategy]
        hyper = sorted({k for r in same for k in r.hyper})
        hyper_diff = [k for k in hyper if len({_show(r.hyper.get(k)) for r in same}) > 1]
        run.differs = ([f"{k}={_show(run.values.get(k))}" for k in differing]
                       + [f"hyper.{k}={_show(run.hyper.get(k))}" for k in hyper_diff])
        label = " ".join([run.strategy] + run.differs)
        run.label = label if len(label) <= MAX_LABEL else run.dir.name
    suffixes: tuple[Callable[[int, Run], str], ...] = (
        lambda i, r: f" ({r.dir.name})",  # then: one folder name, two places
        lambda i, r: f" [{i + 1}]")
    for suffix in suffixes:
        labels = [r.label for r in runs]
        for i, run in enumerate(runs):
            if labels.count(run.label) > 1:
                run.label += suffix(i, run)


def check_metrics(runs: Sequence[Run], metrics: Sequence[str] | None) -> list[str]:
    """The compared metrics: ``metrics`` (each known and recorded by every run) or the
    defaults that some run recorded."""
    recorded = [set(r.rounds[-1]) for r in runs]
    if not metrics:
        return [m for m in DEFAULT_METRICS + NEWCOMER_DEFAULTS
                if any(m in rec for rec in recorded)]
    problems = []
    for m in dict.fromkeys(metrics):
        if m not in METRICS:
            problems.append(f"unknown metric '{m}'{did_you_mean(m, METRICS)}")
            continue
        lacking = [r.label for r, rec in zip(runs, recorded) if m not in rec]
        if lacking:
            problems.append(f"metric '{m}' is not recorded by {', '.join(lacking)}"
                            + (" (no global model)" if m.startswith("global_") else ""))
    if problems:
        shared = [m for m in METRICS if all(m in rec for rec in recorded)]
        raise CompareError("cannot compare these metrics:\n  - " + "\n  - ".join(problems)
                           + f"\n  metrics every run recorded: {', '.join(shared)}")
    return list(dict.fromkeys(metrics))


def load_runs(paths: Sequence[str | Path], allow_unfinished: bool = False) -> list[Run]:
    """The runs, labelled; CompareError naming every folder that cannot be compared."""
    if not paths:
        raise CompareError("no run folder given")
    resolved = [Path(p).expanduser().resolve() for p in paths]
    twice = sorted({str(p) for p in resolved if resolved.count(p) > 1})
    if twice:
        raise CompareError(f"given more than once: {', '.join(twice)}")
    runs, problems = [], []
    for path in resolved:
        try:
            runs.append(load_run(path))
        except CompareError as exc:
            problems.append(str(exc))
    if not problems and not allow_unfinished:
        problems = [f"{r.dir}: not a finished run: {r.unfinished}; --allow-unfinished compares "
                    f"it at its last evaluated round" for r in runs if r.unfinished]
    if problems:
        raise CompareError("cannot compare:\n  - " + "\n  - ".join(problems))
    kinds = {r.metric for r in runs}
    if len(kinds) > 1:
        by = "; ".join(f"{m} ({'lower' if lower_is_better(m) else 'higher'} is better): "
                       + ", ".join(str(r.dir) for r in runs if r.metric == m)
                       for m in sorted(kinds))
        raise CompareError(f"cannot compare runs of different metrics: {by}")
    label_runs(runs)
    return runs


def unit_sentence(metric: str) -> str:
    if lower_is_better(metric):
        return (f"Personalized {metric} over ALL clients (an error: lower is better), as "
                f"recorded")
    return "Personalized accuracy in % over ALL clients"


def records(runs: Sequence[Run], metrics: Sequence[str]) -> tuple[list[dict[str, Any]],
                                                                   list[tuple[str, str]]]:
    """One table record per run (the bench's numbers, ``seeds_done`` 1) and the columns:
    the bench's, then each compared metric the bench's do not show (its final value)."""
    extra = [(m, f"final {m}") for m in metrics if m not in IN_TABLE]
    recs = []
    for run in runs:
        scale = 1.0 if lower_is_better(run.metric) else 100.0
        final = run.summary.get("final") or {}
        rec: dict[str, Any] = {"label": run.label, "dir": str(run.dir),
                               "strategy": run.strategy,
                               "status": run.summary.get("status", ""), "seeds_done": 1,
                               **run.numbers}
        if run.unfinished:
            rec["unfinished"] = run.unfinished
        cov = run.coverage or {}
        rec["clients"] = coverage_cell(cov)
        for key in ("final_clients_covered", "fit_accepted", "fit_sampled", "fit_failed"):
            if key in cov:
                rec[key] = cov[key]
        for key, _ in extra:
            value = final.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                rec[key] = scale * value
        recs.append(rec)
    return recs, list(COLUMNS) + extra


def table_md(runs: Sequence[Run], recs: Sequence[Mapping[str, Any]],
             columns: Sequence[tuple[str, str]]) -> str:
    """The comparison as markdown: the shared settings, what differs, the table, the runs."""
    differing = sorted({d.split("=", 1)[0] for r in runs for d in r.differs})
    lines = [f"# Comparison of {len(runs)} runs", "",
             f"{unit_sentence(runs[0].metric)} (final = last evaluated round); `global` = the "
             f"global model's final mean where the strategy has one; s/round = wall seconds "
             f"per round after the first evaluation. One run per row.", ""]
    common = {k: v for k, v in runs[0].values.items()
              if all(_show(r.values.get(k)) == _show(v) for r in runs)}
    if common:
        lines += [settings_line(common), ""]
    lines += ["Differs between the runs: " + (", ".join(f"`{k}`" for k in differing)
                                              if differing else "the strategy only"), ""]
    lines += ["| run | rounds | " + " | ".join(h for _, h in columns) + " | clients |",
              "|---" * (len(columns) + 3) + "|"]
    for run, rec in zip(runs, recs):
        done = f"{int(rec['rounds'])}/{run.values.get('rounds', '?')}"
        if run.unfinished:
            done += f" ({run.summary.get('status')})"
        lines.append(f"| {run.label} | {done} | " + " | ".join(number_cells(rec, columns))
                     + f" | {rec['clients']} |")
    lines += ["", "`clients`: how many of the configured clients the final metrics cover "
              "(`, fit accepted/sampled` where client fits failed).", "", "Runs:", ""]
    for run in runs:
        covered = coverage_line(run.coverage)
        lines.append(f"- `{run.label}`: {run.dir} ({run.summary.get('status')}"
                     + (f": {run.unfinished}" if run.unfinished else "")
                     + (f"; {covered}" if covered else "") + ")")
    return "\n".join(lines) + "\n"


@dataclass
class Comparison:
    runs: list[Run]
    metrics: list[str]
    table: str  # the markdown table
    files: list[Path]


def compare(paths: Sequence[str | Path], out: str | Path, metrics: Sequence[str] | None = None,
            allow_unfinished: bool = False) -> Comparison:
    """Compare the runs in ``paths``: table.md, table.csv, curves.png and clients.png in
    ``out``; CompareError (nothing written) where they cannot be compared."""
    runs = load_runs(paths, allow_unfinished)
    chosen = check_metrics(runs, metrics)
    recs, columns = records(runs, chosen)
    table = table_md(runs, recs, columns)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table)
    fields = (["label", "dir", "strategy", "status", "unfinished", "rounds"]
              + [c for c, _ in columns] + ["clients", "final_clients_covered", "fit_accepted",
                                           "fit_sampled", "fit_failed"])
    with open(out / "table.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore", restval="")
        w.writeheader()
        w.writerows(recs)
    from flower_pfl.reporting import plots  # matplotlib: imported only when figures are drawn

    metric = runs[0].metric
    title = f"{len(runs)} runs" + (f" ({', '.join(r.label for r in runs)})"
                                   if sum(len(r.label) for r in runs) <= 60 else "")
    files = [out / "table.md", out / "table.csv",
             plots.curves({r.label: [r.rounds] for r in runs}, out / "curves.png",
                          title=title, metric=metric, views=chosen)]
    dist = {}
    for run in runs:
        _, rows = last_evaluation(run.dir)
        dist[run.label] = [float(row[metric]) for row in rows if row.get(metric) not in
                           (None, "") and row.get("newcomer") != "1"]  # participants
    if any(dist.values()):
        files.append(plots.distribution(dist, out / "clients.png", title="per client, last "
                                        "evaluated round", metric=metric))
    return Comparison(runs, chosen, table, files)
