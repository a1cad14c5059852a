"""Figures of runs and benchmarks (matplotlib, headless ``Agg`` backend).

Pure drawing: every function takes plain numbers (rows of ``rounds.csv``/``summary.json``,
per-client accuracies, a weight matrix) and writes one PNG. Nothing here reads results
folders or knows about Flower, so :mod:`flower_pfl.results` (one run) and
:mod:`flower_pfl.tables` (a bench matrix of runs) share it.

* :func:`curves`       -- accuracy vs round per strategy: mean (solid) and worst-10% (dashed),
                          the two views the papers report (FedAMP BMTA curves, PLGU fairness);
* :func:`distribution` -- per-client accuracy of the final round per strategy (box + points;
                          the Self-FL Fig. 3 / PLGU Fig. 6 view);
* :func:`heatmap`      -- an n x n weight/selection matrix (FedAMP Fig. 3), clients ordered by
                          their true group where the partition has groups, group borders drawn.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from flower_pfl.atomic import atomic_write

os.environ.setdefault("MPLBACKEND", "Agg")
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

Rows = Sequence[Mapping[str, object]]


def _num(value: object) -> float:
    try:
        return float(value)  # csv rows hold strings; empty -> nan
    except (TypeError, ValueError):
        return float("nan")


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=110, bbox_inches="tight"),
                     mode="wb")
    finally:
        plt.close(fig)
    return path


def curves(runs: Mapping[str, Sequence[Rows]], path: Path, title: str = "",
           metric: str = "accuracy",
           keys: Sequence[tuple[str, str]] = (("personal_mean", "-"),
                                              ("personal_worst10_mean", "--"))) -> Path:
    """Metric vs round for each label; ``runs[label]`` is one list of round rows per seed.

    Seeds are averaged round by round (rounds all seeds evaluated); the band is +- one std
    over seeds where there are several.
    """
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, seeds) in enumerate(runs.items()):
        seeds = [s for s in seeds if s]
        if not seeds:
            continue
        color = colors[i % len(colors)]
        for key, style in keys:
            per_round: dict[int, list[float]] = {}
            for rows in seeds:
                for r in rows:
                    v = _num(r.get(key))
                    if not np.isnan(v):
                        per_round.setdefault(int(_num(r["round"])), []).append(v)
            rounds = sorted(k for k, v in per_round.items() if len(v) == len(seeds))
            if not rounds:
                continue
            mean = np.array([np.mean(per_round[k]) for k in rounds])
            ax.plot(rounds, mean, style, color=color,
                    label=f"{label} {'worst-10%' if 'worst10' in key else 'mean'}")
            if len(seeds) > 1:
                std = np.array([np.std(per_round[k]) for k in rounds])
                ax.fill_between(rounds, mean - std, mean + std, color=color, alpha=0.15)
    ax.set_xlabel("round")
    ax.set_ylabel(f"personalized {metric}")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    if ax.lines:
        ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def distribution(values: Mapping[str, Sequence[float]], path: Path, title: str = "",
                 metric: str = "accuracy") -> Path:
    """Per-client values (all seeds pooled) per label: a box per label plus every client."""
    labels = [k for k, v in values.items() if len(v)]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(labels) + 2), 4.2))
    if labels:
        data = [np.asarray(values[k], dtype=float) for k in labels]
        ax.boxplot(data, showfliers=False)
        rng = np.random.default_rng(0)
        for i, d in enumerate(data, start=1):
            ax.scatter(i + rng.uniform(-0.18, 0.18, d.size), d, s=6, alpha=0.5)
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=20, fontsize=8)
    ax.set_ylabel(f"per-client personalized {metric} (final round)")
    ax.grid(alpha=0.3, axis="y")
    if title:
        ax.set_title(title, fontsize=10)
    return _save(fig, path)


def group_order(groups: Sequence[int] | None, n: int) -> np.ndarray:
    """Client order for a heatmap: by true group (stable), else by id."""
    if groups is None:
        return np.arange(n)
    return np.argsort(np.asarray(groups), kind="stable")


def heatmap(matrix: np.ndarray, path: Path, title: str = "",
            groups: Sequence[int] | None = None, label: str = "weight") -> Path:
    """An n x n matrix as an image; rows/columns reordered by ``groups`` (if given) with a
    line at every group border, so a block structure shows when the method finds it."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2 or m.size == 0:
        raise ValueError("heatmap needs a non-empty 2-D matrix")
    order = group_order(groups, m.shape[0]) if m.shape[0] == m.shape[1] else np.arange(m.shape[0])
    shown = m[np.ix_(order, order)] if m.shape[0] == m.shape[1] else m
    fig, ax = plt.subplots(figsize=(5.6, 4.8))
    im = ax.imshow(shown, cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, label=label)
    if m.shape[0] == m.shape[1] and m.shape[0] <= 40:  # label every client by its id
        ax.set_xticks(range(m.shape[0]), [str(i) for i in order], fontsize=6, rotation=90)
        ax.set_yticks(range(m.shape[0]), [str(i) for i in order], fontsize=6)
    if groups is not None and m.shape[0] == m.shape[1]:
        g = np.asarray(groups)[order]
        for border in np.flatnonzero(np.diff(g)) + 0.5:
            ax.axhline(border, color="white", lw=0.8)
            ax.axvline(border, color="white", lw=0.8)
        ax.set_xlabel("client (ordered by true group)")
        ax.set_ylabel("client (ordered by true group)")
    else:
        ax.set_xlabel("client j")
        ax.set_ylabel("client i")
    if title:
        ax.set_title(title, fontsize=10)
    return _save(fig, path)
