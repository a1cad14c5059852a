"""A bench's report: its table, its paired comparisons and its figures.

From the finished cells of a :class:`~flower_pfl.matrix.Matrix` (read back through
:mod:`flower_pfl.reporting.results`), writes into the bench's output folder:

* ``table.md`` and ``table.csv`` -- per setting and strategy, mean +- sample std over the
  finished seeds of the final-round mean, weighted mean, worst-10%, top-10%, worst-5%,
  BMTA, the global model's final mean where the strategy has one, and seconds per round;
  the paper's number and our gap to it (ours − paper).  Accuracies in percent; the
  synthetic task's squared error as it is.  A strategy with no finished cell shows its
  status ("not run", "failed", "invalid: ..."), never a number.
* ``pairs.csv`` and table.md's "Paired comparisons" -- for each ``pairs:`` entry [A, B] and
  setting: d_s = A − B on each seed s where both finished, for the final personalized mean,
  the personalized worst-10% and worst-5% and, where both have a global model, the global
  final mean and worst-5%
  (like with like); mean d and the 95% Student-t interval d +- t_{0.975, n-1} s_d / sqrt(n)
  (:func:`flower_pfl.reporting.stats.paired_interval`); verdict: holds (the interval excludes 0 on
  A's better side), does not hold (on B's), not resolved at n seeds (±h) (it contains 0; h
  its half-width: at this spread |mean d| must exceed h to tell from 0), n/a (1 seed).  Lower is
  better for an error metric.
* per setting ``curves-<setting>.png`` (personalized mean, worst-10% and the global
  model's mean vs round, the paper's number as a dotted line), ``clients-<setting>.png``
  and ``heatmap-<setting>-<strategy>-<matrix>.png`` (:mod:`flower_pfl.reporting.plots`; clients
  ordered by their true group where the partition has groups, clients not trained by the
  last evaluated round marked).

Choices left open: a cell counts only where its run completed with every client (see
:func:`flower_pfl.reporting.coverage.client_failures`); s/round is measured after the first
evaluation (the start is not a round's cost).
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from flower_pfl import config as config_mod
from flower_pfl.matrix import COMPARE, Cell, Matrix
from flower_pfl.reporting.coverage import client_failures
from flower_pfl.reporting.heatmaps import MATRIX_BINARY, MATRIX_LABELS, matrix_title, true_groups
from flower_pfl.reporting.metric_kind import lower_is_better, run_metric
from flower_pfl.reporting.pairs import (
    GLOBAL_MARK,
    PAIR_FIELDS,
    global_note,
    metric_words,
    one_model,
    pair_records,
    pairs_md,
)
from flower_pfl.reporting.run_files import read_json, read_rows, read_summary, read_values
from flower_pfl.reporting.run_readings import last_evaluation, untrained
from flower_pfl.reporting.stats import mean_std

# The table's columns: (record key, header)
COLUMNS = (
    ("final_mean", "final mean"),
    ("final_weighted", "weighted"),
    ("final_worst10", "worst-10%"),
    ("final_top10", "top-10%"),
    ("final_worst5", "worst-5%"),
    ("bmta", "BMTA"),
    ("global_final", "global"),
    ("s_per_round", "s/round"),
)


def seconds_per_round(rounds: list[dict[str, Any]], resumed_after: Iterable[int] = ()) -> float:
    """Wall seconds per round after the first evaluated one, from the rounds' ``elapsed_s``.
    A step into a round that a resumed process ran first (the round after one in
    ``resumed_after``) also holds that process's start-up, so it is left out; with no step
    left, the last elapsed time over its round number."""
    skip = set(resumed_after)
    segments: list[list[dict[str, Any]]] = [[rounds[0]]]
    for a, b in zip(rounds, rounds[1:]):
        if a["round"] in skip:
            segments.append([b])
        else:
            segments[-1].append(b)
    spans = [(seg[-1]["elapsed_s"] - seg[0]["elapsed_s"], seg[-1]["round"] - seg[0]["round"])
             for seg in segments if len(seg) > 1]
    if spans:
        return sum(t for t, _ in spans) / sum(n for _, n in spans)
    return rounds[-1]["elapsed_s"] / max(rounds[-1]["round"], 1)


def cell_numbers(cell_dir: Path, finished_only: bool = True) -> dict[str, float] | None:
    """The table's numbers for one finished run, read from its summary.json (accuracies in
    percent); None for a run that did not complete or in which clients failed
    (``finished_only=False``: any run with an evaluated round, at its last one)."""
    summary = read_summary(cell_dir)
    if not summary or not summary.get("rounds"):
        return None
    if finished_only and (summary.get("status") != "completed"
                          or client_failures(cell_dir) is not None):
        return None
    rounds = summary["rounds"]
    final = summary["final"]
    # accuracies in percent; the synthetic task's metric is a squared error: left as it is
    scale = 1.0 if lower_is_better(run_metric(cell_dir)) else 100.0
    last = rounds[-1]
    per_round = seconds_per_round(rounds, summary.get("resumed_after", ()))
    nums = {"final_mean": scale * final["personal_mean"],
            "final_weighted": scale * final["personal_weighted_mean"],
            "final_worst10": scale * final["personal_worst10_mean"],
            "final_top10": scale * final["personal_top10_mean"],
            "bmta": scale * summary["bmta"],
            **({"final_worst5": scale * final["personal_worst5_mean"]}
               if "personal_worst5_mean" in final else {}),
            "s_per_round": per_round,
            "rounds": float(last["round"])}
    if "global_mean" in final:
        nums["global_final"] = scale * final["global_mean"]
        for key, col in (("global_worst10_mean", "global_worst10"),
                         ("global_worst5_mean", "global_worst5")):
            if key in final:
                nums[col] = scale * final[key]
    bench = read_json(cell_dir / "bench-cell.json")
    if isinstance(bench, dict):
        nums["wall_s"] = bench.get("wall_s", float("nan"))
    return nums


def round_series(cell_dir: Path) -> list[dict[str, Any]]:
    """The run's evaluated rounds (summary.json's ``rounds``); for a slimmed cell, whose
    summary keeps the first and last only, its rounds.csv (in the series archive) as
    numbers."""
    summary = read_summary(cell_dir) or {}
    rounds = list(summary.get("rounds") or [])
    if len(rounds) >= int(summary.get("rounds_total", 0)):
        return rounds
    out = []
    for row in read_rows(cell_dir, "rounds"):
        rec: dict[str, Any] = {}
        for k, v in row.items():
            try:
                rec[k] = float(v)
            except (TypeError, ValueError):
                continue
        if "round" in rec:
            rec["round"] = int(rec["round"])
        out.append(rec)
    return out or rounds


def cell_engine(cell_dir: Path) -> str:
    """``flwr`` (the bench's `flwr run`) or ``inprocess`` (benchmarks/matrix_inprocess.py)."""
    bench = read_json(cell_dir / "bench-cell.json")
    return str(bench.get("engine", "flwr")) if isinstance(bench, dict) else "flwr"


def collect(matrix: Matrix, cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """One record per (setting, strategy): status and mean/std over the finished seeds."""
    records = []
    for setting, spec in matrix.settings.items():
        for strategy in matrix.strategies_in(setting):
            mine = [c for c in cells if c.setting == setting and c.strategy == strategy]
            per_seed = {c.seed: cell_numbers(c.dir) for c in mine}
            done = {s: v for s, v in per_seed.items() if v is not None}
            rec: dict[str, Any] = {"setting": setting, "strategy": strategy,
                                   "seeds_done": len(done), "seeds_total": len(mine),
                                   "seeds": sorted(done)}
            if all(c.tree is None for c in mine):  # (an alias names its registered one)
                rec["status"] = "not run (not registered)"
            elif not done:
                failed = any((c.dir / "bench-error.txt").is_file() for c in mine)
                broken = [why for c in mine if (why := client_failures(c.dir))]
                rec["status"] = f"invalid: {broken[0]}" if broken else (
                    "failed" if failed else "not run")
            else:
                rec["status"] = "done" if len(done) == len(mine) else "partial"
                rec["engine"] = "+".join(sorted({cell_engine(c.dir) for c in mine
                                                 if per_seed[c.seed] is not None}))
                rec["per_seed"] = done  # seed -> that cell's numbers (for the pairs)
                rec["lower_is_better"] = any(lower_is_better(run_metric(c.dir)) for c in mine
                                             if per_seed[c.seed] is not None)
                for col, _ in COLUMNS:
                    vals = [v[col] for v in done.values() if col in v]
                    if vals and len(vals) == len(done):
                        rec[col], rec[col + "_std"] = mean_std(vals)
            paper = (spec.get("paper") or {}).get(strategy)
            if paper is not None:
                rec["paper"] = float(paper)
                ours = rec.get(COMPARE[matrix.compare])
                if ours is not None:
                    rec["gap"] = ours - float(paper)
            paper_g = (spec.get("paper-global") or {}).get(strategy)
            if paper_g is not None:
                rec["paper_global"] = float(paper_g)
                if rec.get("global_final") is not None:
                    rec["gap_global"] = rec["global_final"] - float(paper_g)
            records.append(rec)
    return records


SHOWN = ("clients", "rounds", "fraction-fit", "eval-every", "model", "data.partition",
         "data.alpha", "data.classes-per-client", "data.groups", "data.max-train-samples",
         "data.subsample", "train.epochs", "train.steps", "train.batch-size", "train.lr")


def setting_line(matrix: Matrix, setting: str) -> str:
    """The main run settings of a setting's cells (from the first registered cell's config)."""
    cell = next((c for c in matrix.cells(Path("/nonexistent")) if c.setting == setting
                 and c.tree is not None), None)
    if cell is None:
        return ""
    try:
        values = config_mod.validate(copy.deepcopy(cell.tree)).values
    except config_mod.ConfigError:
        return ""
    return settings_line(values)


def settings_line(values: Mapping[str, Any]) -> str:
    """``Settings: `clients=20`, ...``: the SHOWN keys of a run's configuration values (the
    partition's own keys only for that partition)."""
    shown = [f"{k}={values[k]}" for k in SHOWN if k in values and values[k] is not None
             and not (k.startswith("data.") and k.split(".")[1] in ("alpha",) and
                      values.get("data.partition") != "dirichlet")
             and not (k == "data.classes-per-client"
                      and values.get("data.partition") != "pathological")
             and not (k == "data.groups" and values.get("data.partition") != "practical")]
    if "data.subsample" in values and values["data.subsample"] is None:
        shown.append("data.subsample=null (all samples)")
    return "Settings: " + ", ".join(f"`{x}`" for x in shown)


def number_cells(rec: Mapping[str, Any], columns: Sequence[tuple[str, str]] = COLUMNS
                 ) -> list[str]:
    """A record's numbers as the table prints them, one per column: the value (one seed) or
    mean ± std, 2 decimals (s/round 1); "–" where the record has none."""
    cells_ = []
    for col, _ in columns:
        if col not in rec:
            cells_.append("–")
        else:
            digits = 1 if col == "s_per_round" else 2
            cells_.append(f"{rec[col]:.{digits}f}" if rec["seeds_done"] == 1 else
                          f"{rec[col]:.{digits}f} ± {rec[col + '_std']:.{digits}f}")
    return cells_


def write_table(matrix: Matrix, records: Sequence[Mapping[str, Any]], out: Path) -> None:
    fields = ["setting", "strategy", "status", "engine", "seeds_done", "seeds_total"]
    for col, _ in COLUMNS:
        fields += [col, col + "_std"]
    fields += ["paper", "gap", "paper_global", "gap_global"]
    with open(out / "table.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore", restval="")
        w.writeheader()
        w.writerows(records)

    compared = {"bmta": "BMTA", "final": "final mean", "weighted": "weighted"}[matrix.compare]
    lines = [f"# {matrix.name}", "",
             f"Matrix `{matrix.path.name}` on base `{matrix.base_path.name}`; seeds "
             f"{matrix.seeds} (unless a strategy or setting lists its own; column seeds = "
             f"finished/planned). {metric_words(records)} over ALL clients (final = last "
             f"evaluated round), mean ± sample std over the finished seeds (a single value "
             f"where one seed finished); `global` = the "
             f"global model's final mean where the strategy has one; s/round = wall seconds per "
             f"round after the first evaluation. The paper's number sits beside our "
             f"**{compared}**; gap = ours − paper.{global_note(records)}", ""]
    for setting, spec in matrix.settings.items():
        lines.append(f"## {setting}")
        line = setting_line(matrix, setting)
        if line:
            lines += ["", line]
        if matrix.overrides:
            lines += ["", "Overridden for this bench (`--set`): " + ", ".join(
                f"`{k}={v}`" for k, v in matrix.overrides.items())]
        if spec.get("note"):
            lines += ["", str(spec["note"]).strip()]
        lines += ["", "| strategy | paper name | seeds | " + " | ".join(h for _, h in COLUMNS)
                  + " | paper | gap |", "|---" * (len(COLUMNS) + 5) + "|"]
        for rec in (r for r in records if r["setting"] == setting):
            if rec["status"].startswith(("not run", "failed", "invalid")):
                cells_ = [rec["status"]] + [""] * (len(COLUMNS) - 1)  # never a number
            else:
                cells_ = number_cells(rec)
            paper = rec.get("paper")
            paper_s = "" if paper is None else f"{paper:.2f}"
            gap = rec.get("gap")
            gap_s = "" if gap is None else f"{gap:+.2f}"
            if rec.get("paper_global") is not None:
                paper_s += f" (global {rec['paper_global']:.2f})"
                if rec.get("gap_global") is not None:
                    gap_s += f" (global {rec['gap_global']:+.2f})"
            mark = " (in-process)" if "inprocess" in rec.get("engine", "") else ""
            if one_model(rec):
                mark = GLOBAL_MARK + mark
            lines.append(f"| {rec['strategy']}{mark} | "
                         f"{matrix.paper_names.get(rec['strategy'], '')} | "
                         f"{rec['seeds_done']}/{rec['seeds_total']} | " + " | ".join(cells_)
                         + f" | {paper_s} | {gap_s} |")
        lines.append("")
    if matrix.pairs:
        pairs = pair_records(matrix, records)
        with open(out / "pairs.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=PAIR_FIELDS, extrasaction="ignore", restval="")
            w.writeheader()
            w.writerows(pairs)
        lines += pairs_md(matrix, pairs, [(r["setting"], r["strategy"]) for r in records
                                          if one_model(r)])
    if any("inprocess" in r.get("engine", "") for r in records):
        lines += ["Rows marked (in-process) ran their cells through `flower_pfl.running.inprocess` "
                  "(benchmarks/matrix_inprocess.py: the same cell.yaml, Strategy and client "
                  "classes, direct calls instead of `flwr run`; s/round is then not the "
                  "simulation's).", ""]
    if matrix.notes.strip():
        lines += ["## Settings chosen where the paper is silent", "", matrix.notes.strip(), ""]
    (out / "table.md").write_text("\n".join(lines))


def write_plots(matrix: Matrix, cells: Sequence[Cell], records: Sequence[Mapping[str, Any]],
                out: Path) -> list[Path]:
    """Per setting: curves over rounds (with the paper's numbers), per-client distribution
    of the final round, and the heatmaps of the matrices a strategy saved (first finished
    seed; its last evaluated round, clients not trained by then marked)."""
    from flower_pfl.reporting import plots  # matplotlib: imported only when figures are drawn

    written = []
    compared = {"bmta": "BMTA", "final": "final mean", "weighted": "weighted mean"}
    for setting, spec in matrix.settings.items():
        curves: dict[str, list[list[dict[str, Any]]]] = {}
        dist: dict[str, list[float]] = {}
        metric = "accuracy"
        for strategy in matrix.strategies:
            done = [c for c in cells if c.setting == setting and c.strategy == strategy
                    and cell_numbers(c.dir) is not None]
            if not done:
                continue
            curves[strategy] = []
            dist[strategy] = []
            for c in done:
                curves[strategy].append(round_series(c.dir))
                rows = read_rows(c.dir, "clients")
                if rows:
                    metric = run_metric(c.dir)
                    last = max(int(r["round"]) for r in rows)
                    dist[strategy] += [float(r[metric]) for r in rows if int(r["round"]) == last]
            for name in ("attention", "selection"):
                npy = done[0].dir / f"{name}.npy"
                if npy.is_file():
                    # a cell copied without its config.json (e.g. committed by hand) still
                    # gets its heatmap, without the group order
                    values = read_values(done[0].dir)
                    at, clients = last_evaluation(done[0].dir)
                    written.append(plots.heatmap(
                        np.load(npy), out / f"heatmap-{setting}-{strategy}-{name}.png",
                        title=matrix_title(name, strategy, at, f"\n{setting}, seed "
                                           f"{done[0].seed}"),
                        groups=true_groups(values) if values else None,
                        untrained=untrained(clients),
                        label=MATRIX_LABELS.get(name, "weight"),
                        binary=MATRIX_BINARY.get(name)))
        if curves:
            written.append(plots.curves(curves, out / f"curves-{setting}.png",
                                        title=f"{matrix.name} / {setting}", metric=metric,
                                        paper=spec.get("paper") or {},
                                        paper_global=spec.get("paper-global") or {},
                                        paper_label=f"compare with our {compared[matrix.compare]}"))
            written.append(plots.distribution(dist, out / f"clients-{setting}.png",
                                              title=f"{matrix.name} / {setting}: per-client, "
                                              f"final round, all seeds", metric=metric))
    return written
