"""A bench matrix: strategies x settings x seeds, each cell one run's full YAML.

A matrix file (see ``benchmarks/*.yaml``; ``flower-pfl bench`` runs it)::

    name: fedacs-table1                 # output folder name (default: the file's stem)
    base: ../simulation.yaml            # base run YAML (relative to this file; default: the app's)
    set: {clients: 100, data: {partition: dirichlet, subsample: null}}   # for every cell
    strategies:                         # registered or not: unregistered ones show "not run"
      - local
      - fedacs: {hyper: {fedacs: {pick-ratio: 0.8}}}   # overrides for this strategy only
      - plgu-lf-rho0: {strategy: plgu-lf, hyper: {plgu-lf: {rho: 0}}}  # an alias: a second
                                        # cell column of a registered strategy, own overrides
    settings:
      dir05-50:
        set: {data: {alpha: 0.5, max-train-samples: 50}}
        paper: {local: 75.98, ditto: 78.79}            # the paper's number (percent)
        paper-global: {ditto: 76.34}                   # ... for the global model
        note: ...                                      # copied under the setting's table
    seeds: [0, 1, 2]
    compare: final     # which of our numbers sits beside the paper's: bmta | final | weighted
    paper-names: {local: Local}          # how the paper calls a strategy (shown in the table)
    pairs: [[plgu-lf, fedsam], [plgu-grep, fedrep]]   # named comparisons A vs B
    notes: |                             # copied into table.md: the choices the paper leaves open
      ...

``pairs``: each entry names two strategies of this matrix, [A, B]. Per setting the table
reports A − B on each seed where both finished -- the final personalized mean, the
personalized worst-10% and, where both have a global model, the global final mean --
with its mean, the 95% Student-t interval and a verdict (holds / does not hold / tie /
n/a with one seed; lower is better for an error metric): :mod:`flower_pfl.tables`,
:mod:`flower_pfl.stats`.

A cell's YAML is the base, then the matrix's ``set``, the setting's ``set``, the strategy's
overrides and the command line's ``--set`` (:func:`flower_pfl.config.merge`), with its
strategy and seed, and only that strategy's ``hyper`` section.  Every problem of the file
is collected into ONE :class:`MatrixError` before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from flower_pfl import registry
from flower_pfl.config import merge
from flower_pfl.procs import APP_DIR

# which of our numbers sits beside the paper's: matrix's `compare` -> table column
COMPARE = {"bmta": "bmta", "final": "final_mean", "weighted": "final_weighted"}
KEYS = {"name", "base", "set", "strategies", "settings", "seeds", "compare", "paper-names",
        "notes", "pairs"}
SETTING_KEYS = {"set", "paper", "paper-global", "note"}


class MatrixError(ValueError):
    """The matrix file is invalid; the message says what to fix."""


@dataclass
class Cell:
    setting: str
    strategy: str
    seed: int
    tree: dict[str, Any] | None  # the cell's full run YAML (None: strategy not registered)
    dir: Path

    @property
    def key(self) -> str:
        return f"{self.setting}/{self.strategy}/seed-{self.seed}"


@dataclass
class Matrix:
    name: str
    path: Path
    base_path: Path
    strategies: dict[str, dict[str, Any]]
    settings: dict[str, dict[str, Any]]
    seeds: list[int]
    compare: str = "bmta"
    paper_names: dict[str, str] = field(default_factory=dict)
    notes: str = ""
    base: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)  # --set: every cell, applied last
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (A, B): A - B per seed

    def cells(self, out: Path) -> list[Cell]:
        cells = []
        for setting, spec in self.settings.items():
            for strategy, overrides in self.strategies.items():
                for seed in self.seeds:
                    tree = None
                    registered = str(overrides.get("strategy", strategy))  # an alias's
                    if registered in registry.REGISTRY:
                        own = {k: v for k, v in overrides.items() if k != "strategy"}
                        tree = merge(self.base, spec.get("set") or {})
                        tree = merge(tree, own)
                        tree = merge(tree, self.overrides)
                        tree["strategy"] = registered
                        tree["seed"] = seed
                        hyper = tree.get("hyper") or {}
                        tree["hyper"] = {k: v for k, v in hyper.items() if k == registered}
                        if not tree["hyper"]:
                            tree.pop("hyper")
                    cells.append(Cell(setting, strategy, seed, tree,
                                      out / "runs" / setting / strategy / f"seed-{seed}"))
        return cells


def load_matrix(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Matrix:
    """Read a matrix file; ``overrides`` (dotted keys) apply to every cell, last."""
    path = Path(path).resolve()
    if not path.is_file():
        raise MatrixError(f"matrix file not found: {path}")
    raw = yaml.safe_load(path.read_text()) or {}
    problems = [f"unknown key '{k}' (allowed: {sorted(KEYS)})" for k in raw if k not in KEYS]
    base_path = (path.parent / raw["base"]).resolve() if raw.get("base") else \
        APP_DIR / "simulation.yaml"
    if not base_path.is_file():
        problems.append(f"base config not found: {base_path}")
    strategies: dict[str, dict[str, Any]] = {}
    for item in raw.get("strategies") or []:
        if isinstance(item, str):
            strategies[item] = {}
        elif isinstance(item, Mapping) and len(item) == 1:
            name, over = next(iter(item.items()))
            strategies[str(name)] = dict(over or {})
        else:
            problems.append(f"strategies: {item!r} is neither a name nor {{name: overrides}}")
    if not strategies:
        problems.append("'strategies' lists no strategy")
    settings = raw.get("settings") or {"default": {}}
    if not isinstance(settings, Mapping):
        problems.append("'settings' must map a setting name to {set:, paper:, ...}")
        settings = {}
    for name, spec in settings.items():
        extra = set(spec or {}) - SETTING_KEYS
        if extra:
            problems.append(f"settings.{name}: unknown key(s) {sorted(extra)}")
    seeds = raw.get("seeds", [0])
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
        problems.append(f"'seeds' must be a non-empty list of integers, got {seeds!r}")
    compare = raw.get("compare", "bmta")
    if compare not in COMPARE:
        problems.append(f"'compare' = {compare!r}: allowed are {sorted(COMPARE)}")
    pairs, pair_problems = check_pairs(raw.get("pairs"), list(strategies))
    problems += pair_problems
    if problems:
        raise MatrixError(f"invalid matrix {path}:\n  - " + "\n  - ".join(problems))
    base = yaml.safe_load(base_path.read_text()) or {}
    base = merge(base, raw.get("set") or {})
    return Matrix(overrides=dict(overrides or {}), name=str(raw.get("name") or path.stem),
                  path=path, base_path=base_path,
                  strategies=strategies, settings={k: dict(v or {}) for k, v in settings.items()},
                  seeds=list(seeds), compare=compare,
                  paper_names=dict(raw.get("paper-names") or {}),
                  notes=str(raw.get("notes") or ""), base=base, pairs=pairs)


def check_pairs(raw: Any, strategies: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """``pairs: [[A, B], ...]``: two distinct strategy names of this matrix each; returns
    (the pairs, the problems)."""
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        return [], [f"'pairs' must be a list of [A, B] strategy-name pairs, got {raw!r}"]
    pairs, problems = [], []
    for item in raw:
        if not (isinstance(item, (list, tuple)) and len(item) == 2
                and all(isinstance(x, str) for x in item)):
            problems.append(f"pairs: {item!r} is not a pair [A, B] of strategy names")
        elif item[0] == item[1]:
            problems.append(f"pairs: {list(item)} compares a strategy with itself")
        elif any(x not in strategies for x in item):
            problems.append(f"pairs: {list(item)} names "
                            f"{[x for x in item if x not in strategies]}, not a strategy of this "
                            f"matrix (its strategies: {list(strategies)})")
        else:
            pairs.append((item[0], item[1]))
    return pairs, problems
