"""Figures of runs and benchmarks (matplotlib, headless ``Agg`` backend).

Pure drawing: every function takes plain numbers (rows of ``rounds.csv``/``summary.json``,
per-client accuracies, a weight matrix) and writes one PNG. Nothing here reads results
folders or knows about Flower, so :mod:`flower_pfl.reporting.results` (one run),
:mod:`flower_pfl.reporting.tables` (a bench matrix of runs) and
:mod:`flower_pfl.reporting.compare` (any finished runs) share it.

* :func:`run_curves`   -- one run: personalized mean, worst-10% and top-10% and the global
                          model's mean vs round, each its own colour (matplotlib's cycle)
                          and line style, beside the loss (train, personalized test);
* :func:`curves`       -- a bench setting or a comparison of runs: one panel per view
                          (default personalized mean, personalized worst-10%, global mean
                          where a strategy has one), a line per label in its own colour
                          (mean over seeds, band = +- one std), the
                          paper's number as a dotted horizontal line in the strategy's
                          colour (the FedAMP BMTA curves, PLGU fairness);
* :func:`distribution` -- per-client accuracy of the final round per strategy (box + points;
                          the Self-FL Fig. 3 / PLGU Fig. 6 view);
* :func:`heatmap`      -- an n x n weight/selection matrix (FedAMP Fig. 3), clients ordered by
                          their true group where the partition has groups, group borders
                          drawn; a 0/1 matrix gets a two-colour legend instead of a colour
                          bar, a continuous one a colour bar over the data's range; clients
                          not trained yet are hatched and named under the figure.

Rounds are integers on every x axis; accuracies are drawn in percent (the tables' unit),
an error (mse) as it is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from flower_pfl.atomic import atomic_write

os.environ.setdefault("MPLBACKEND", "Agg")
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

Rows = Sequence[Mapping[str, object]]


def _num(value: Any) -> float:
    try:
        return float(value)  # csv rows hold strings; empty -> nan
    except (TypeError, ValueError):
        return float("nan")


def save_figure(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` (atomically; parents made) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=110, bbox_inches="tight"),
                     mode="wb")
    finally:
        plt.close(fig)
    return path


def _scale(metric: str) -> float:
    return 100.0 if metric == "accuracy" else 1.0


def _unit(metric: str) -> str:
    return "accuracy (%)" if metric == "accuracy" else metric


#: legend handle length (font sizes): long enough to show a dashed or dotted line's pattern
LEGEND_HANDLE = 4.0
#: the line styles that tell curves of one colour apart (a run's views; >10 bench labels)
STYLES = ("-", "--", ":", "-.")
#: what a panel of :func:`curves` shows, by the round rows' key; other keys are their own name
VIEW_NAMES = {"personal_mean": "personalized mean",
              "personal_weighted_mean": "personalized weighted mean",
              "personal_worst10_mean": "personalized worst-10%",
              "personal_top10_mean": "personalized top-10%",
              "personal_worst5_mean": "personalized worst-5%",
              "personal_bmta": "personalized BMTA (best mean so far)",
              "global_mean": "global model mean"}


def cycle_colors() -> list[str]:
    """Matplotlib's colour cycle (``axes.prop_cycle``), in order."""
    return list(plt.rcParams["axes.prop_cycle"].by_key()["color"])


def _rounds_axis(ax: Axes) -> None:
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.grid(alpha=0.3)


def series(seeds: Sequence[Rows], key: str, scale: float = 1.0
           ) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(rounds, mean, std) of ``key`` over seeds, on the rounds every seed has a value."""
    seeds = [s for s in seeds if s]
    per_round: dict[int, list[float]] = {}
    for rows in seeds:
        for r in rows:
            v = _num(r.get(key))
            if not np.isnan(v):
                per_round.setdefault(int(_num(r["round"])), []).append(scale * v)
    rounds = sorted(k for k, v in per_round.items() if len(v) == len(seeds) and seeds)
    mean = np.array([np.mean(per_round[k]) for k in rounds])
    std = np.array([np.std(per_round[k]) for k in rounds])
    return rounds, mean, std


def run_curves(rows: Rows, path: Path, title: str = "", metric: str = "accuracy",
               loss: Mapping[str, Mapping[int, float]] | None = None) -> Path:
    """One run: the metric vs round (personalized mean, worst-10%, top-10%; the global
    model's mean where the rows have it) and, where ``loss`` gives any, a loss panel
    (``loss[label][round] = value``, e.g. train and personalized test loss)."""
    loss = {k: v for k, v in (loss or {}).items() if v}
    fig, axes = plt.subplots(1, 2 if loss else 1, figsize=(11 if loss else 7, 4.2),
                             squeeze=False)
    ax = axes[0][0]
    scale = _scale(metric)
    colors = cycle_colors()
    # one colour per curve (matplotlib's cycle) and a line style each, long legend handles
    # so that the dashes show there too
    for i, (key, style, label) in enumerate((
            ("personal_mean", "-", "personalized mean"),
            ("personal_worst10_mean", "--", "personalized worst-10%"),
            ("personal_top10_mean", ":", "personalized top-10%"),
            ("global_mean", "-.", "global model mean"))):
        rounds, mean, _ = series([rows], key, scale)
        if rounds:
            ax.plot(rounds, mean, style, color=colors[i % len(colors)], label=label,
                    marker="o" if len(rounds) <= 12 else None, ms=3)
    _rounds_axis(ax)
    ax.set_ylabel(_unit(metric))
    ax.set_title(title or metric, fontsize=10)
    if ax.lines:
        ax.legend(fontsize=7, handlelength=LEGEND_HANDLE)
    if loss:
        lx = axes[0][1]
        for i, (label, by_round) in enumerate(loss.items()):
            rounds = sorted(by_round)
            # colours after the accuracy panel's four: no colour means two things
            lx.plot(rounds, [by_round[k] for k in rounds], color=colors[(i + 4) % len(colors)],
                    label=label,
                    marker="o" if len(rounds) <= 12 else None, ms=3)
        _rounds_axis(lx)
        lx.set_ylabel("loss")
        lx.set_title("loss (mean over clients)", fontsize=10)
        lx.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def curves(runs: Mapping[str, Sequence[Rows]], path: Path, title: str = "",
           metric: str = "accuracy", paper: Mapping[str, float] | None = None,
           paper_global: Mapping[str, float] | None = None, paper_label: str = "",
           views: Sequence[str] | None = None) -> Path:
    """A bench setting: ``runs[label]`` is one list of round rows per seed.  Panels
    (``views``: round-row keys; default personalized mean, personalized worst-10% and --
    where a label has a global model -- the global mean); seeds averaged round by round
    (rounds all seeds evaluated), band = +- one std over seeds.  A label's colour is the
    cycle's; past the cycle's length the line style changes.  ``paper[label]`` /
    ``paper_global[label]``: the paper's number in the plotted unit (percent for
    accuracy), drawn as a dotted horizontal line in the label's colour on the personalized
    / global mean panel; ``paper_label`` says which of our numbers it compares with."""
    paper, paper_global = dict(paper or {}), dict(paper_global or {})
    scale = _scale(metric)
    if views is None:
        has_global = any(series(s, "global_mean")[0] for s in runs.values())
        views = ["personal_mean", "personal_worst10_mean"] + (["global_mean"] if has_global
                                                               else [])
    numbers_of = {"personal_mean": paper, "global_mean": paper_global}
    fig, axes = plt.subplots(1, len(views), figsize=(4.6 * len(views), 4.2), squeeze=False)
    colors = cycle_colors()
    handles: dict[str, Line2D] = {}
    for col, key in enumerate(views):
        name, numbers = VIEW_NAMES.get(key, key), numbers_of.get(key, {})
        ax = axes[0][col]
        for i, (label, seeds) in enumerate(runs.items()):
            color = colors[i % len(colors)]
            style = STYLES[(i // len(colors)) % len(STYLES)]
            rounds, mean, std = series(seeds, key, scale)
            if rounds:
                (line,) = ax.plot(rounds, mean, style, color=color, lw=1.3,
                                  marker="o" if len(rounds) <= 12 else None, ms=3)
                handles.setdefault(label, line)
                if len([s for s in seeds if s]) > 1:
                    ax.fill_between(rounds, mean - std, mean + std, color=color, alpha=0.15)
            if label in numbers:
                ax.axhline(float(numbers[label]), color=color, ls=":", lw=1.2)
        _rounds_axis(ax)
        ax.set_ylabel(_unit(metric))
        ax.set_title(name, fontsize=10)
    labels = list(handles)
    lines = [handles[k] for k in labels]
    if paper or paper_global:
        lines.append(Line2D([], [], color="grey", ls=":"))
        labels.append("paper's number" + (f" ({paper_label})" if paper_label else ""))
    rows = -(-len(labels) // 6)  # legend rows, six entries each
    if lines:
        fig.legend(lines, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=7,
                   bbox_to_anchor=(0.5, 0.0), frameon=False, handlelength=LEGEND_HANDLE)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.015 + 0.045 * rows, 1, 1))
    return save_figure(fig, path)


def distribution(values: Mapping[str, Sequence[float]], path: Path, title: str = "",
                 metric: str = "accuracy") -> Path:
    """Per-client values (all seeds pooled) per label: a box per label plus every client."""
    labels = [k for k, v in values.items() if len(v)]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(labels) + 2), 4.2))
    scale = _scale(metric)
    if labels:
        data = [scale * np.asarray(values[k], dtype=float) for k in labels]
        ax.boxplot(data, showfliers=False)
        rng = np.random.default_rng(0)
        for i, d in enumerate(data, start=1):
            ax.scatter(i + rng.uniform(-0.18, 0.18, d.size), d, s=6, alpha=0.5)
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=30, fontsize=8, ha="right")
    ax.set_ylabel(f"personalized {_unit(metric)} per client")
    ax.grid(alpha=0.3, axis="y")
    if title:
        ax.set_title(title, fontsize=10)
    return save_figure(fig, path)


def group_order(groups: Sequence[int] | None, n: int) -> np.ndarray:
    """Client order for a heatmap: by true group (stable), else by id."""
    if groups is None:
        return np.arange(n)
    return np.argsort(np.asarray(groups), kind="stable")


def is_binary(m: np.ndarray) -> bool:
    """Whether every entry is 0 or 1 (a selection mask)."""
    return bool(np.isin(m, (0.0, 1.0)).all())


def heatmap(matrix: np.ndarray, path: Path, title: str = "",
            groups: Sequence[int] | None = None, label: str = "weight",
            untrained: Sequence[int] = (), binary: bool | None = None,
            binary_labels: tuple[str, str] = ("not selected (0)", "selected (1)")) -> Path:
    """An n x n matrix as an image; rows/columns reordered by ``groups`` (if given) with a
    line at every group border, so a block structure shows when the method finds it.

    A 0/1 mask (``binary``; None: any matrix of only 0s and 1s) is drawn in two colours with
    a legend (``binary_labels``); any other with a colour bar (``label``) over the data's
    range (a weight matrix that happens to be 0/1 -- every client weighting only itself --
    keeps its colour bar: ``binary=False``).  ``untrained``: partition-ids that had
    not trained by then -- their rows and columns are hatched and a note names them."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2 or m.size == 0:
        raise ValueError("heatmap needs a non-empty 2-D matrix")
    square = m.shape[0] == m.shape[1]
    order = group_order(groups, m.shape[0]) if square else np.arange(m.shape[0])
    shown = m[np.ix_(order, order)] if square else m
    fig, ax = plt.subplots(figsize=(6.0, 5.2))
    notes: list[str] = []  # printed under the figure
    binary = is_binary(m) if binary is None else binary and is_binary(m)
    if binary:
        cmap = ListedColormap(["#f2f2f2", "#1f5aa6"])
        ax.imshow(shown, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        ax.legend(handles=[Patch(facecolor="#f2f2f2", edgecolor="grey", label=binary_labels[0]),
                           Patch(facecolor="#1f5aa6", label=binary_labels[1])],
                  loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=8,
                  frameon=False)
    else:
        finite = shown[np.isfinite(shown)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        extend = "neither"
        if square and m.shape[0] > 2:
            # a self-weight far above every peer weight would leave the peers one colour:
            # the scale spans the off-diagonal entries and the diagonal is drawn above it
            diag = np.diag(shown)
            off = shown[~np.eye(m.shape[0], dtype=bool)]
            if np.isfinite(diag).all() and off.size and diag.min() > 2 * off.max() > 0:
                hi, extend = float(off.max()), "max"
                span = f"{diag.min():.2f}" if np.isclose(diag.min(), diag.max()) else \
                    f"{diag.min():.2f} to {diag.max():.2f}"
                notes.append(f"diagonal (self-weights {span}) is above the colour scale, which "
                             f"spans the peers' weights")
        im = ax.imshow(shown, cmap="viridis", interpolation="nearest", vmin=lo,
                       vmax=hi if hi > lo else lo + 1e-12)
        fig.colorbar(im, ax=ax, label=label, fraction=0.046, pad=0.04, extend=extend)
    if square and m.shape[0] <= 40:  # label every client by its id
        ax.set_xticks(range(m.shape[0]), [str(i) for i in order], fontsize=6, rotation=90)
        ax.set_yticks(range(m.shape[0]), [str(i) for i in order], fontsize=6)
    if groups is not None and square:
        g = np.asarray(groups)[order]
        for border in np.flatnonzero(np.diff(g)) + 0.5:
            ax.axhline(border, color="red", lw=0.8)
            ax.axvline(border, color="red", lw=0.8)
        ax.set_xlabel("client j (ordered by true group)")
        ax.set_ylabel("client i (ordered by true group)")
    else:
        ax.set_xlabel("client j")
        ax.set_ylabel("client i")
    untrained = sorted(int(u) for u in untrained)
    if untrained and square:
        position = {int(pid): k for k, pid in enumerate(order)}
        for pid in untrained:
            k = position.get(pid)
            if k is None:
                continue
            for x, y, w, h in ((-0.5, k - 0.5, m.shape[0], 1), (k - 0.5, -0.5, 1, m.shape[0])):
                ax.add_patch(Rectangle((x, y), w, h, fill=False, hatch="///",
                                       edgecolor="orange", lw=0))
        names = ", ".join(map(str, untrained[:15])) + (" ..." if len(untrained) > 15 else "")
        notes.append(f"hatched: {len(untrained)} of {m.shape[0]} clients not trained yet (no "
                     f"upload, their stored model is the initial one):\n{names}")
    if notes:
        ax.text(0.5, -0.2 if binary else -0.12, "\n".join(notes), transform=ax.transAxes,
                ha="center", va="top", fontsize=7, color="dimgray")
    if title:
        ax.set_title(title, fontsize=9)
    return save_figure(fig, path)
