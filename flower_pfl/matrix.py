"""A bench matrix: strategies x settings x seeds, each cell one run's full YAML.

A matrix file (see ``benchmarks/*.yaml``; ``flower-pfl bench`` runs it)::

    name: fedacs-table1                 # output folder name (default: the file's stem)
    base: ../simulation.yaml            # base run YAML (relative to this file; default: the app's)
    set: {clients: 100, data: {partition: dirichlet, subsample: null}}   # for every cell
    strategies:                         # registered names (`flower-pfl strategies`)
      - local
      - fedacs: {hyper: {fedacs: {pick-ratio: 0.8}}}   # overrides for this strategy only
      - plgu-lf-rho0: {strategy: plgu-lf, hyper: {plgu-lf: {rho: 0}}}  # an alias: a second
                                        # cell column of a registered strategy, own overrides
      - fedavg: {seeds: [0, 1, 2, 3, 4]}  # this strategy's seeds (default: the matrix's)
    settings:
      dir05-50:
        set: {data: {alpha: 0.5, max-train-samples: 50}}
        paper: {local: 75.98, ditto: 78.79}            # the paper's number (percent)
        paper-global: {ditto: 76.34}                   # ... for the global model
        note: ...                                      # copied under the setting's table
      k5:
        strategies: [local, fedacs]     # only these run in this setting (default: all)
        seeds: [0]                      # only these of each strategy's seeds (default: all)
    seeds: [0, 1, 2]
    compare: final     # which of our numbers sits beside the paper's: bmta | final | weighted
    paper-names: {local: Local}          # how the paper calls a strategy (shown in the table)
    pairs: [[plgu-lf, fedsam], [plgu-grep, fedrep]]   # named comparisons A vs B
    notes: |                             # copied into table.md: the choices the paper leaves open
      ...

``pairs``: each entry names two strategies of this matrix, [A, B]. Per setting the table
reports A − B on each seed where both finished -- the final personalized mean, the
personalized worst-10% and, where both have a global model, the global final mean --
with its mean, the 95% Student-t interval and a verdict (holds / does not hold / not
resolved at n seeds (±h), h the interval's half-width / n/a with one seed; lower is better
for an error metric): :mod:`flower_pfl.reporting.tables`, :mod:`flower_pfl.reporting.stats`.

The cells: per setting, each strategy the setting runs (its ``strategies``, default all) on
each of the strategy's seeds (its ``seeds``, default the matrix's) that the setting keeps
(its ``seeds``, default all) -- so a matrix states which cells belong to its design, and a
bench of it, run again, has nothing left to do once they are done.

A cell's YAML is the base, then the matrix's ``set``, the setting's ``set``, the strategy's
overrides and the command line's ``--set`` (:func:`flower_pfl.config.merge`), with its
strategy and seed, and only that strategy's ``hyper`` section.  Every problem of the file
is collected into ONE :class:`MatrixError` before anything runs: unknown keys, a strategy
(or an alias's ``strategy``) that is not registered -- with the closest registered name --,
paper numbers for a label the matrix does not run, and every cell's full configuration
through :func:`flower_pfl.config.validate`, the validator of ``flower-pfl run`` (so
``rounds: -2`` or a misspelt hyper-parameter stops the bench before its first cell).
docs/bench.md documents the format with a complete example.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from flower_pfl import registry
from flower_pfl.config import APP_DIR, ConfigError, merge, validate
from flower_pfl.hyper import read_yaml

# which of our numbers sits beside the paper's: matrix's `compare` -> table column
COMPARE = {"bmta": "bmta", "final": "final_mean", "weighted": "final_weighted"}
KEYS = {"name", "base", "set", "strategies", "settings", "seeds", "compare", "paper-names",
        "notes", "pairs"}
SETTING_KEYS = {"set", "paper", "paper-global", "note", "strategies", "seeds"}
STRATEGY_KEYS = {"strategy", "seeds"}  # a strategy entry's keys that are not run keys


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

    def strategies_in(self, setting: str) -> list[str]:
        """The strategy labels a setting runs, in the matrix's order."""
        chosen = self.settings[setting].get("strategies")
        return [s for s in self.strategies if chosen is None or s in chosen]

    def seeds_of(self, setting: str, strategy: str) -> list[int]:
        """The seeds of a (setting, strategy): the strategy's (default the matrix's), only
        those the setting keeps."""
        seeds = self.strategies[strategy].get("seeds") or self.seeds
        kept = self.settings[setting].get("seeds")
        return [s for s in seeds if kept is None or s in kept]

    def cells(self, out: Path) -> list[Cell]:
        cells = []
        for setting, spec in self.settings.items():
            for strategy in self.strategies_in(setting):
                overrides = self.strategies[strategy]
                for seed in self.seeds_of(setting, strategy):
                    tree = None
                    registered = str(overrides.get("strategy", strategy))  # an alias's
                    if registered in registry.REGISTRY:
                        own = {k: v for k, v in overrides.items() if k not in STRATEGY_KEYS}
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
    raw = read_yaml(path.read_text()) or {}
    problems = [f"unknown key '{k}' (allowed: {sorted(KEYS)})" for k in raw if k not in KEYS]
    base_path = (path.parent / raw["base"]).resolve() if raw.get("base") else \
        APP_DIR / "simulation.yaml"
    if not base_path.is_file():
        problems.append(f"base config not found: {base_path}")
    strategies: dict[str, dict[str, Any]] = {}
    for item in raw.get("strategies") or []:
        if isinstance(item, str):
            strategies[item] = {}
        elif isinstance(item, Mapping) and len(item) == 1 and \
                isinstance(next(iter(item.values())) or {}, Mapping):
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
    if not is_seed_list(seeds):
        problems.append(f"'seeds' must be a non-empty list of distinct integers, got {seeds!r}")
        seeds = [0]  # (the cells are still built: every other problem is reported too)
    problems += check_selections(strategies, settings)
    strategies, settings = valid_selections(strategies, settings)
    compare = raw.get("compare", "bmta")
    if compare not in COMPARE:
        problems.append(f"'compare' = {compare!r}: allowed are {sorted(COMPARE)}")
    pairs, pair_problems = check_pairs(raw.get("pairs"), list(strategies))
    problems += pair_problems
    problems += check_strategies(strategies)
    problems += check_labels(raw, settings, list(strategies))
    base = (read_yaml(base_path.read_text()) or {}) if base_path.is_file() else {}
    base = merge(base, raw.get("set") or {})
    matrix = Matrix(overrides=dict(overrides or {}), name=str(raw.get("name") or path.stem),
                    path=path, base_path=base_path, strategies=strategies,
                    settings={k: dict(v or {}) for k, v in settings.items()},
                    seeds=list(seeds), compare=compare,
                    paper_names=dict(raw.get("paper-names") or {}),
                    notes=str(raw.get("notes") or ""), base=base, pairs=pairs)
    problems += check_design(matrix)
    if base_path.is_file():  # every cell's configuration, problems of the file above or not
        problems += check_cells(matrix)
    if problems:
        raise MatrixError(f"invalid matrix {path} (nothing was run):\n  - "
                          + "\n  - ".join(problems))
    return matrix


def is_seed_list(seeds: Any) -> bool:
    return isinstance(seeds, list) and bool(seeds) and len(set(seeds)) == len(seeds) and all(
        isinstance(s, int) and not isinstance(s, bool) for s in seeds)


def is_label_list(labels: Any) -> bool:
    return isinstance(labels, list) and bool(labels) and all(isinstance(x, str) for x in labels)


def check_selections(strategies: Mapping[str, Mapping[str, Any]], settings: Any) -> list[str]:
    """A strategy's ``seeds`` and a setting's ``strategies`` / ``seeds`` name what exists:
    seed lists of integers, labels of this matrix; every setting runs at least one cell."""
    problems = []
    for label, over in strategies.items():
        if "seeds" in over and not is_seed_list(over["seeds"]):
            problems.append(f"strategies: '{label}': 'seeds' must be a non-empty list of "
                            f"distinct integers, got {over['seeds']!r}")
    if not isinstance(settings, Mapping):
        return problems
    for name, spec in settings.items():
        spec = spec or {}
        chosen = spec.get("strategies")
        if chosen is not None:
            if not is_label_list(chosen):
                problems.append(f"settings.{name}.strategies: must be a non-empty list of "
                                f"strategy labels of this matrix, got {chosen!r}")
            else:
                problems += [f"settings.{name}.strategies: '{x}' is not a strategy of this "
                             f"matrix{closest(x, list(strategies))}"
                             for x in chosen if x not in strategies]
        if "seeds" in spec and not is_seed_list(spec["seeds"]):
            problems.append(f"settings.{name}.seeds: must be a non-empty list of distinct "
                            f"integers, got {spec['seeds']!r}")
    return problems


def valid_selections(strategies: dict[str, dict[str, Any]], settings: Any
                     ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The strategies and settings without the selections :func:`check_selections` refused
    (so that every cell can still be built and checked)."""
    strategies = {label: {k: v for k, v in over.items()
                          if k != "seeds" or is_seed_list(v)} for label, over in strategies.items()}
    clean = {}
    for name, spec in (settings.items() if isinstance(settings, Mapping) else []):
        spec = dict(spec or {})
        if "seeds" in spec and not is_seed_list(spec["seeds"]):
            spec.pop("seeds")
        if "strategies" in spec:
            chosen = spec["strategies"]
            spec["strategies"] = [x for x in chosen if x in strategies] \
                if is_label_list(chosen) else list(strategies)
        clean[name] = spec
    return strategies, clean


def check_design(matrix: Matrix) -> list[str]:
    """What the design runs meets what the file asks of it: a setting runs each of its
    strategies on at least one seed; a paper number is given only where its strategy runs;
    each pair runs together in some setting on some seed."""
    problems = []
    for setting, spec in matrix.settings.items():
        labels = matrix.strategies_in(setting)
        for label in labels:
            if not matrix.seeds_of(setting, label):
                problems.append(
                    f"settings.{setting}.seeds {spec.get('seeds')} keeps none of '{label}''s "
                    f"seeds {matrix.strategies[label].get('seeds') or matrix.seeds} (list the "
                    f"setting's strategies to leave it out there)")
        for key in ("paper", "paper-global"):
            numbers = spec.get(key)
            if isinstance(numbers, Mapping):
                problems += [f"settings.{setting}.{key}: '{x}' does not run in this setting "
                             f"(settings.{setting}.strategies)" for x in numbers
                             if x in matrix.strategies and x not in labels]
    for a, b in matrix.pairs:
        if not any(set(matrix.seeds_of(s, a)) & set(matrix.seeds_of(s, b))
                   for s in matrix.settings
                   if a in matrix.strategies_in(s) and b in matrix.strategies_in(s)):
            problems.append(f"pairs: [{a}, {b}] never run together (no setting runs both on "
                            f"a common seed)")
    return problems


def closest(name: str, candidates: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or ``""``."""
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def check_strategies(strategies: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every label runs a registered strategy (an alias names it in ``strategy:``)."""
    problems = []
    for label, over in strategies.items():
        name = str(over.get("strategy", label))
        if name in registry.REGISTRY:
            continue
        where = f"'{label}'" if name == label else f"'{label}' (strategy: '{name}')"
        problems.append(f"strategies: {where} is not a registered strategy"
                        f"{closest(name, list(registry.REGISTRY))}; `flower-pfl strategies` "
                        f"lists them (an alias: {{label: {{strategy: NAME, ...}}}})")
    return problems


def check_labels(raw: Mapping[str, Any], settings: Any, labels: Sequence[str]) -> list[str]:
    """Paper numbers are given for strategies this matrix runs (a misspelt label would
    silently drop the number, its gap and its line on the curves)."""
    problems = []
    places: list[tuple[str, Any]] = []
    if isinstance(settings, Mapping):
        for name, spec in settings.items():
            for key in ("paper", "paper-global"):
                places.append((f"settings.{name}.{key}", (spec or {}).get(key)))
    places.append(("paper-names", raw.get("paper-names")))
    for where, mapping in places:
        if mapping is None:
            continue
        if not isinstance(mapping, Mapping):
            problems.append(f"{where}: must map a strategy of the matrix to a value")
            continue
        for label in mapping:
            if label not in labels:
                problems.append(f"{where}: '{label}' is not a strategy of this matrix"
                                f"{closest(str(label), labels)}")
    return problems


def check_cells(matrix: Matrix) -> list[str]:
    """Every cell's configuration through the run validator; a problem shared by several
    cells is reported once, with the cells it concerns."""
    found: dict[str, list[str]] = {}
    cells = matrix.cells(Path("/nonexistent"))
    for cell in cells:
        if cell.tree is None:
            continue
        try:
            validate(cell.tree, source=cell.key)
        except ConfigError as exc:
            for problem in str(exc).split("\n  - ")[1:]:
                found.setdefault(problem.strip(), []).append(f"{cell.setting}/{cell.strategy}")
    problems = []
    every = {f"{c.setting}/{c.strategy}" for c in cells}
    for problem, where in found.items():
        where = list(dict.fromkeys(where))
        shown = "every cell" if set(where) == every and len(every) > 1 else \
            ", ".join(where[:4]) + (f" and {len(where) - 4} more" if len(where) > 4 else "")
        problems.append(f"{problem} [{shown}]")
    return problems


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
