"""``flower-pfl bench MATRIX.yaml``: strategies x settings x seeds, each cell a real run.

A matrix file (see ``benchmarks/*.yaml``)::

    name: fedacs-table1                 # output folder name (default: the file's stem)
    base: ../simulation.yaml            # base run YAML (relative to this file; default: the app's)
    set: {clients: 100, data: {partition: dirichlet, subsample: null}}   # for every cell
    strategies:                         # registered or not: unregistered ones show "not run"
      - local
      - fedacs: {hyper: {fedacs: {pick-ratio: 0.8}}}   # overrides for this strategy only
    settings:
      dir05-50:
        set: {data: {alpha: 0.5, max-train-samples: 50}}
        paper: {local: 75.98, ditto: 78.79}            # the paper's number (percent)
        paper-global: {ditto: 76.34}                   # ... for the global model
    seeds: [0, 1, 2]
    compare: final     # which of our numbers sits beside the paper's: bmta | final | weighted
    paper-names: {local: Local}          # how the paper calls a strategy (shown in the table)
    notes: |                             # copied into table.md: the choices the paper leaves open
      ...

Every cell is one ``flwr run`` in Ray simulation (the ``flower-pfl run`` path) on its own
YAML, ``<out>/runs/<setting>/<strategy>/seed-<s>/cell.yaml``, written in full before the
run: ``flower-pfl run --config <that file>`` reproduces the cell alone. A cell whose
``summary.json`` says ``completed`` for an identical ``cell.yaml`` is skipped on a rerun,
so an interrupted bench resumes where it stopped; a changed cell configuration -- or a
changed registry default it resolves to (its ``config.json``) -- reruns.

All cells of one bench share ONE SuperLink (``--superlink per-cell`` starts one per run, as
``flower-pfl run`` does); ``--ray shared`` also starts ONE Ray instance that every cell's
simulation attaches to (``RAY_ADDRESS``) instead of a Ray start and stop per run. See
docs/BENCHMARKS.md (a) for what each saves.

Output (``<out>``): ``table.md`` and ``table.csv`` (per setting and strategy: mean +- std
over the finished seeds of the final-round mean, weighted mean, worst-10%, top-10%, BMTA,
global accuracy where the strategy has a global model, and seconds per round; the paper's
number and our gap to it), ``cells.csv`` (one row per cell), and per setting
``curves-<setting>.png``, ``clients-<setting>.png`` and ``heatmap-<setting>-<strategy>-
<matrix>.png`` (clients ordered by their true group where the partition has groups).
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import yaml

from flower_pfl import config as config_mod
from flower_pfl import registry
from flower_pfl.launch import APP_DIR, LaunchError, run_simulation, simulation_superlink

# What the table reports per cell: column -> (summary path, scaled to percent?)
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
COMPARE = {"bmta": "bmta", "final": "final_mean", "weighted": "final_weighted"}


class MatrixError(ValueError):
    """The matrix file is invalid; the message says what to fix."""


# ----------------------------------------------------------------------------- matrix
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

    def cells(self, out: Path) -> list[Cell]:
        cells = []
        for setting, spec in self.settings.items():
            for strategy, overrides in self.strategies.items():
                for seed in self.seeds:
                    tree = None
                    if strategy in registry.REGISTRY:
                        tree = merge(self.base, spec.get("set") or {})
                        tree = merge(tree, overrides)
                        tree = merge(tree, self.overrides)
                        tree["strategy"] = strategy
                        tree["seed"] = seed
                        hyper = tree.get("hyper") or {}
                        tree["hyper"] = {k: v for k, v in hyper.items() if k == strategy}
                        if not tree["hyper"]:
                            tree.pop("hyper")
                    cells.append(Cell(setting, strategy, seed, tree,
                                      out / "runs" / setting / strategy / f"seed-{seed}"))
        return cells


def merge(tree: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``overrides`` (nested mappings and/or dotted keys) into a copy of ``tree``."""
    out = copy.deepcopy(dict(tree))
    for key, value in (overrides or {}).items():
        parts = str(key).split(".")
        node = out
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        last = parts[-1]
        if isinstance(value, Mapping) and isinstance(node.get(last), Mapping):
            node[last] = merge(node[last], value)
        else:
            node[last] = copy.deepcopy(value)
    return out


def load_matrix(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Matrix:
    """Read a matrix file; ``overrides`` (dotted keys) apply to every cell, last."""
    path = Path(path).resolve()
    if not path.is_file():
        raise MatrixError(f"matrix file not found: {path}")
    raw = yaml.safe_load(path.read_text()) or {}
    problems = []
    known = {"name", "base", "set", "strategies", "settings", "seeds", "compare", "paper-names",
             "notes"}
    problems += [f"unknown key '{k}' (allowed: {sorted(known)})" for k in raw if k not in known]
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
        extra = set(spec or {}) - {"set", "paper", "paper-global", "note"}
        if extra:
            problems.append(f"settings.{name}: unknown key(s) {sorted(extra)}")
    seeds = raw.get("seeds", [0])
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
        problems.append(f"'seeds' must be a non-empty list of integers, got {seeds!r}")
    compare = raw.get("compare", "bmta")
    if compare not in COMPARE:
        problems.append(f"'compare' = {compare!r}: allowed are {sorted(COMPARE)}")
    if problems:
        raise MatrixError(f"invalid matrix {path}:\n  - " + "\n  - ".join(problems))
    base = yaml.safe_load(base_path.read_text()) or {}
    base = merge(base, raw.get("set") or {})
    return Matrix(overrides=dict(overrides or {}), name=str(raw.get("name") or path.stem),
                  path=path, base_path=base_path,
                  strategies=strategies, settings={k: dict(v or {}) for k, v in settings.items()},
                  seeds=list(seeds), compare=compare,
                  paper_names=dict(raw.get("paper-names") or {}),
                  notes=str(raw.get("notes") or ""), base=base)


# ------------------------------------------------------------------------------- cells
def _cell_yaml(cell: Cell) -> str:
    tree = dict(cell.tree or {})
    tree["output-dir"] = str(cell.dir.parent)
    tree["run-name"] = cell.dir.name
    return yaml.safe_dump(tree, sort_keys=True)


def _defaults_unchanged(cell: Cell, text: str) -> bool:
    """Whether the run's resolved configuration (its ``config.json``: the cell.yaml with the
    registry's defaults filled in) is what the cell.yaml resolves to today.  The strategy's
    hyper-parameters are compared whole: a changed default or a hyper-parameter added since
    (FedAMP's ``evaluate``) reruns the cell.  Of the run settings, only keys the run had are
    compared (a setting added later, e.g. a timeout, did not change what ran); where it ran
    (output-dir, run-name, cache-dir) is not.  A cell without config.json (copied by hand)
    is judged on its cell.yaml alone."""
    path = cell.dir / "config.json"
    if not path.is_file():
        return True
    try:
        then = json.loads(path.read_text())
    except json.JSONDecodeError:
        return False
    now = json.loads(config_mod.validate(yaml.safe_load(text), str(cell.dir)).to_json())
    if then.get("hyper") != now["hyper"]:
        return False
    old = then.get("values", {})
    where = {"output-dir", "run-name", "cache-dir"}  # where it ran, not what it ran
    return all(old[k] == v for k, v in now["values"].items() if k in old and k not in where)


def cell_state(cell: Cell) -> str:
    """'not registered', 'done' (completed for this exact cell.yaml and today's defaults)
    or 'todo'."""
    if cell.tree is None:
        return "not registered"
    summary, yml = cell.dir / "summary.json", cell.dir / "cell.yaml"
    text = _cell_yaml(cell)
    if summary.is_file() and yml.is_file() and yml.read_text() == text \
            and _defaults_unchanged(cell, text):
        try:
            if json.loads(summary.read_text()).get("status") == "completed" \
                    and client_failures(cell.dir) is None:
                return "done"
        except json.JSONDecodeError:
            pass
    return "todo"


def to_run(cells: Sequence[Cell], states: Mapping[str, str],
           only: Mapping[str, Sequence | None]) -> list[Cell]:
    """The cells still to run ('todo') among those selected by ``only`` (strategy / setting /
    seed lists; None or empty = all), in the order the strategies were asked for (e.g. the
    method of interest first)."""
    todo = [c for c in cells if states[c.key] == "todo" and
            all(not only.get(k) or v in only[k] for k, v in
                (("strategy", c.strategy), ("setting", c.setting), ("seed", c.seed)))]
    if only.get("strategy"):
        todo.sort(key=lambda c: list(only["strategy"]).index(c.strategy))
    return todo


def _prepare(cell: Cell) -> tuple[config_mod.RunConfig, Path]:
    if cell.dir.exists():
        shutil.rmtree(cell.dir)  # results files append: a rerun starts from an empty folder
    cell.dir.mkdir(parents=True)
    path = cell.dir / "cell.yaml"
    path.write_text(_cell_yaml(cell))
    return config_mod.load(path), path


def _run_shared(cfg: config_mod.RunConfig, path: Path, cell: Cell, env: dict, procs,
                echo: bool, timeout_s: float | None) -> str:
    """One ``flwr run`` on an already running simulation SuperLink; returns the status."""
    from flower_pfl.procs import _bin, _stream, run_status, toml_string

    run_config = cell.dir / "run-config.toml"
    run_config.write_text(f"config-file = {toml_string(str(path))}\noverrides = \"\"\n"
                          f"results-dir = {toml_string(str(cell.dir))}\n")
    federation = (f"num-supernodes={cfg['clients']} "
                  f"client-resources-num-cpus={cfg['client-resources.num-cpus']} "
                  f"client-resources-num-gpus={cfg['client-resources.num-gpus']}")
    cmd = [_bin("flwr"), "run", str(APP_DIR), "local", "--stream", "--federation-config",
           federation, "--run-config", str(run_config)]
    run_id = _stream(cmd, env, cell.dir / "flwr-run.log", echo, timeout_s, procs)
    procs.snapshot()
    status = run_status(run_id, env) if run_id else "unknown"
    if status != "finished:completed":
        raise LaunchError(f"run {run_id or '?'} ended with status '{status}'; see "
                          f"{cell.dir / 'flwr-run.log'}")
    return status


# Ray puts its AF_UNIX sockets at <temp-dir>/session_<date>_<time>_<pid>/sockets/plasma_store
# (~65 bytes below the temp dir) and refuses paths over 107 bytes.
RAY_SOCKET_SUFFIX = "/session_2026-11-26_18-17-47_329120_4194304/sockets/plasma_store"
# Where ray_temp_dir puts the shared instance when workdir/ray is too long for its sockets.
RAY_SHORT_TMP_DIR, RAY_SHORT_TMP_PREFIX = "/tmp", "fplray-"


def ray_temp_dir(workdir: Path) -> Path:
    """Ray's --temp-dir for the shared instance: ``workdir/ray`` where its socket paths fit
    Linux's 107-byte limit, else a new short folder under /tmp (a long TMPDIR made
    `ray start --head` fail: "AF_UNIX path length cannot exceed 107 bytes")."""
    tmp = workdir / "ray"
    if len(str(tmp) + RAY_SOCKET_SUFFIX) > 107:
        tmp = Path(tempfile.mkdtemp(prefix=RAY_SHORT_TMP_PREFIX, dir=RAY_SHORT_TMP_DIR))
    return tmp


@contextmanager
def shared_ray(workdir: Path, log_path: Path) -> Iterator[str]:
    """One Ray instance (``ray start --head``) for every cell of the bench; yields its address.

    Each cell's simulation attaches to it through ``RAY_ADDRESS`` (Flower's Ray backend calls
    ``ray.init()`` without an address, which honours the variable) instead of starting and
    stopping a Ray instance per run. Stopped by PID on exit: the processes that name its
    temp dir (:func:`ray_temp_dir`) on their command line, with their descendants and
    sessions (never ``ray stop``, which ends every Ray process on the machine)."""
    from flower_pfl.procs import _alive, free_port, process_tree, stop_tree

    ray_bin = str(Path(sys.executable).parent / "ray")
    tmp = ray_temp_dir(workdir)
    port = free_port()
    import ray._private.services as services  # the address Ray itself would bind

    ip = services.get_node_ip_address()
    cmd = [ray_bin, "start", "--head", f"--node-ip-address={ip}", f"--port={port}",
           f"--num-cpus={os.cpu_count() or 1}", "--num-gpus=0", "--include-dashboard=false",
           f"--temp-dir={tmp}", "--disable-usage-stats"]
    env = dict(os.environ, RAY_DISABLE_USAGE_STATS="1")
    try:
        with open(log_path, "ab") as log:
            try:
                subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=True,
                               timeout=300)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                raise LaunchError(f"`ray start --head` failed ({exc}); see {log_path}") from exc
        yield f"{ip}:{port}"
    finally:
        # the processes naming the temp dir (GCS, raylet) and their descendants and sessions:
        # the agents and workers rename themselves (ray::DashboardAgent, ...) and were left
        # behind when only the named ones were stopped
        named = {p for p in _pids_naming(str(tmp)) if p != os.getpid()}
        ours = set().union(named, *(process_tree(p) for p in named))
        stop_tree(ours)
        current = Path("/tmp/ray/ray_current_cluster")
        try:
            if f":{port}" in current.read_text():
                current.unlink()  # do not leave a stale pointer to a cluster that is gone
        except OSError:
            pass
        assert not any(_alive(p) for p in ours)
        shutil.rmtree(tmp, ignore_errors=True)


def _restore_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def _pids_naming(text: str) -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if text.encode() in fh.read():
                        pids.add(int(entry))
            except OSError:
                continue
    return pids


def _fmt_s(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def run_bench(matrix: Matrix, out: Path, superlink: str = "shared", echo: bool = False,
              timeout_s: float | None = None, only: Mapping[str, Sequence] | None = None,
              log=print, ray: str = "per-run", retries: int = 1) -> list[dict[str, Any]]:
    """Run every cell not done yet (optionally only some strategies/settings/seeds), then
    write the table and plots. Returns one record per cell of the matrix.

    A cell whose run failed (e.g. Ray's start timed out) or in which clients failed is run
    again up to ``retries`` times; a configuration error is not retried."""
    out.mkdir(parents=True, exist_ok=True)
    cells = matrix.cells(out)
    states = {c.key: cell_state(c) for c in cells}
    todo = to_run(cells, states, only or {})
    n = len(cells)
    log(f"[bench] {matrix.name}: {n} cells ({sum(s == 'done' for s in states.values())} done, "
        f"{sum(s == 'not registered' for s in states.values())} not registered, {len(todo)} to run)"
        f" -> {out}", flush=True)
    started = time.time()
    durations: dict[str, list[float]] = {}
    with ExitStack() as stack:
        shared = None
        for k, cell in enumerate([c for c in cells if c not in todo] + todo, start=1):
            if cell not in todo:
                why = {"done": "done, skipped",
                       "not registered": "strategy not registered: not run",
                       "todo": "not selected"}[states[cell.key]]
                log(f"[bench] cell {k}/{n} {cell.key}: {why}", flush=True)
                continue
            t0 = time.time()
            log(f"[bench] cell {k}/{n} {cell.key}: running (elapsed "
                f"{_fmt_s(t0 - started)})", flush=True)
            for attempt in range(retries + 1):
                retry = False
                try:
                    cfg, path = _prepare(cell)
                    if superlink == "shared":
                        if shared is None:
                            wd = Path(tempfile.mkdtemp(prefix="flower-pfl-bench-"))
                            stack.callback(shutil.rmtree, wd, True)
                            if ray == "shared":  # before the SuperLink: it inherits RAY_ADDRESS
                                address = stack.enter_context(shared_ray(wd, out / "ray.log"))
                                stack.callback(_restore_env, "RAY_ADDRESS",
                                               os.environ.get("RAY_ADDRESS"))
                                os.environ["RAY_ADDRESS"] = address
                            shared = stack.enter_context(
                                simulation_superlink(wd, out / "superlink.log"))
                        _run_shared(cfg, path, cell, *shared, echo=echo, timeout_s=timeout_s)
                    else:
                        run_simulation(cfg, path, [], cell.dir, timeout_s=timeout_s, echo=echo)
                    why = client_failures(cell.dir)
                    status = "completed" if why is None else "invalid"
                    if why is not None:
                        (cell.dir / "bench-error.txt").write_text(f"clients failed: {why}\n")
                        retry = True
                except config_mod.ConfigError as exc:  # deterministic: retrying cannot help
                    status = "failed"
                    (cell.dir / "bench-error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
                except (LaunchError, OSError) as exc:  # e.g. Ray's start timed out under load
                    status = "failed"
                    (cell.dir / "bench-error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
                    retry = True
                    if shared is not None:  # a failed run may leave a simulation behind
                        stack.close()
                        shared = None
                if not retry or attempt == retries:
                    break
                log(f"[bench] cell {k}/{n} {cell.key}: attempt {attempt + 1} {status} "
                    f"({(cell.dir / 'bench-error.txt').read_text().strip()[:300]}); retrying",
                    flush=True)
            wall = time.time() - t0
            (cell.dir / "bench-cell.json").write_text(json.dumps(
                {"status": status, "wall_s": round(wall, 2), "engine": "flwr",
                 "superlink": superlink, "ray": ray}, indent=2))
            if status == "completed":
                durations.setdefault(cell.setting, []).append(wall)
            states[cell.key] = "done" if status == "completed" else "failed"
            left = [c for c in todo if states[c.key] == "todo"]
            every = [d for ds in durations.values() for d in ds]
            eta = sum(sum(durations.get(c.setting, every)) / len(durations.get(c.setting, every))
                      for c in left) if every else None
            log(f"[bench] cell {k}/{n} {cell.key}: {status} in {_fmt_s(wall)} | elapsed "
                f"{_fmt_s(time.time() - started)} | est. left {_fmt_s(eta if left else 0)} "
                f"({len(left)} cells to run)", flush=True)
            if status != "completed":
                log(f"[bench]   {(cell.dir / 'bench-error.txt').read_text().strip()[:500]}",
                    flush=True)
    records = collect(matrix, cells)
    write_table(matrix, records, out)
    write_plots(matrix, cells, records, out)
    log(f"[bench] table: {out / 'table.md'}", flush=True)
    return records


# ----------------------------------------------------------------------------- results
def client_failures(cell_dir: Path) -> str | None:
    """Why a completed run's numbers are not the configuration's, or None.

    A run can reach ``completed`` while clients failed (e.g. Ray killed workers for memory):
    the strategy then trains with fewer clients than configured and evaluates fewer than all.
    Such a cell is not the matrix's setting, so it gets no number (and reruns on resume)."""
    cfg_path = cell_dir / "config.json"
    if not cfg_path.is_file():
        return None
    n = int(json.loads(cfg_path.read_text()).get("values", {}).get("clients", 0))
    fit_failed = sum(int(float(r.get("fit_failed") or 0))
                     for r in _read_csv(cell_dir / "server.csv"))
    per_round: dict[str, int] = {}
    for r in _read_csv(cell_dir / "clients.csv"):
        per_round[r["round"]] = per_round.get(r["round"], 0) + 1
    short = {k: v for k, v in per_round.items() if v < n}
    if not fit_failed and not short:
        return None
    return (f"{fit_failed} failed client fit(s); {len(short)} evaluation round(s) with fewer "
            f"than all {n} clients")


def cell_numbers(cell_dir: Path) -> dict[str, float] | None:
    """The table's numbers for one finished run, read from its summary.json (percent); None
    for a run that did not complete or in which clients failed (see client_failures)."""
    path = cell_dir / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    if summary.get("status") != "completed" or not summary.get("rounds"):
        return None
    if client_failures(cell_dir) is not None:
        return None
    rounds = summary["rounds"]
    final = summary["final"]
    cfg_path = cell_dir / "config.json"
    values = json.loads(cfg_path.read_text()).get("values", {}) if cfg_path.is_file() else {}
    # accuracies in percent; the synthetic task's metric is a squared error: left as it is
    scale = 1.0 if values.get("data.dataset") == "synthetic-gaussian" else 100.0
    first, last = rounds[0], rounds[-1]
    if last["round"] > first["round"]:
        per_round = (last["elapsed_s"] - first["elapsed_s"]) / (last["round"] - first["round"])
    else:
        per_round = last["elapsed_s"] / max(last["round"], 1)
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
    bench = cell_dir / "bench-cell.json"
    if bench.is_file():
        nums["wall_s"] = json.loads(bench.read_text()).get("wall_s", float("nan"))
    return nums


def cell_engine(cell_dir: Path) -> str:
    """``flwr`` (the bench's `flwr run`) or ``inprocess`` (benchmarks/matrix_inprocess.py)."""
    try:
        return str(json.loads((cell_dir / "bench-cell.json").read_text()).get("engine", "flwr"))
    except (OSError, json.JSONDecodeError):
        return "flwr"


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std  # std: sample std over seeds (0 with one seed)


def collect(matrix: Matrix, cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """One record per (setting, strategy): status and mean/std over the finished seeds."""
    records = []
    for setting, spec in matrix.settings.items():
        for strategy in matrix.strategies:
            mine = [c for c in cells if c.setting == setting and c.strategy == strategy]
            per_seed = {c.seed: cell_numbers(c.dir) for c in mine}
            done = {s: v for s, v in per_seed.items() if v is not None}
            rec: dict[str, Any] = {"setting": setting, "strategy": strategy,
                                   "seeds_done": len(done), "seeds_total": len(mine),
                                   "seeds": sorted(done)}
            if strategy not in registry.REGISTRY:
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
                for col, _ in COLUMNS:
                    vals = [v[col] for v in done.values() if col in v]
                    if vals and len(vals) == len(done):
                        rec[col], rec[col + "_std"] = _mean_std(vals)
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


def _setting_line(matrix: Matrix, setting: str) -> str:
    """The main run settings of a setting's cells (from the first registered cell's config)."""
    cell = next((c for c in matrix.cells(Path("/nonexistent")) if c.setting == setting
                 and c.tree is not None), None)
    if cell is None:
        return ""
    try:
        values = config_mod.validate(copy.deepcopy(cell.tree)).values
    except config_mod.ConfigError:
        return ""
    shown = [f"{k}={values[k]}" for k in SHOWN if k in values and values[k] is not None
             and not (k.startswith("data.") and k.split(".")[1] in ("alpha",) and
                      values["data.partition"] != "dirichlet")
             and not (k == "data.classes-per-client" and values["data.partition"] != "pathological")
             and not (k == "data.groups" and values["data.partition"] != "practical")]
    if values.get("data.subsample") is None:
        shown.append("data.subsample=null (all samples)")
    return "Settings: " + ", ".join(f"`{x}`" for x in shown)


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
             f"{matrix.seeds}. Personalized accuracy in % over ALL clients (final = last "
             f"evaluated round), mean ± sample std over the finished seeds (a single value "
             f"where one seed finished); `global` = the "
             f"global model's final mean where the strategy has one; s/round = wall seconds per "
             f"round after the first evaluation. The paper's number sits beside our "
             f"**{compared}**; gap = ours − paper.", ""]
    for setting, spec in matrix.settings.items():
        lines.append(f"## {setting}")
        line = _setting_line(matrix, setting)
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
                cells_ = []
                for col, _ in COLUMNS:
                    if col not in rec:
                        cells_.append("–")
                    elif col == "s_per_round":
                        cells_.append(f"{rec[col]:.1f}")
                    elif rec["seeds_done"] == 1:  # one seed: no spread to show
                        cells_.append(f"{rec[col]:.2f}")
                    else:
                        cells_.append(f"{rec[col]:.2f} ± {rec[col + '_std']:.2f}")
            paper = rec.get("paper")
            paper_s = "" if paper is None else f"{paper:.2f}"
            gap = rec.get("gap")
            gap_s = "" if gap is None else f"{gap:+.2f}"
            if rec.get("paper_global") is not None:
                paper_s += f" (global {rec['paper_global']:.2f})"
                if rec.get("gap_global") is not None:
                    gap_s += f" (global {rec['gap_global']:+.2f})"
            mark = " (in-process)" if "inprocess" in rec.get("engine", "") else ""
            lines.append(f"| {rec['strategy']}{mark} | "
                         f"{matrix.paper_names.get(rec['strategy'], '')} | "
                         f"{rec['seeds_done']}/{rec['seeds_total']} | " + " | ".join(cells_)
                         + f" | {paper_s} | {gap_s} |")
        lines.append("")
    if any("inprocess" in r.get("engine", "") for r in records):
        lines += ["Rows marked (in-process) ran their cells through `flower_pfl.inprocess` "
                  "(benchmarks/matrix_inprocess.py: the same cell.yaml, Strategy and client "
                  "classes, direct calls instead of `flwr run`; s/round is then not the "
                  "simulation's).", ""]
    if matrix.notes.strip():
        lines += ["## Settings chosen where the paper is silent", "", matrix.notes.strip(), ""]
    (out / "table.md").write_text("\n".join(lines))


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path) as fh:
        return list(csv.DictReader(fh))


def write_plots(matrix: Matrix, cells: Sequence[Cell], records, out: Path) -> list[Path]:
    from flower_pfl import plots
    from flower_pfl.results import true_groups

    written = []
    for setting in matrix.settings:
        curves: dict[str, list] = {}
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
                summary = json.loads((c.dir / "summary.json").read_text())
                curves[strategy].append(summary["rounds"])
                rows = _read_csv(c.dir / "clients.csv")
                if rows:
                    metric = "mse" if "mse" in rows[0] else "accuracy"
                    last = max(int(r["round"]) for r in rows)
                    dist[strategy] += [float(r[metric]) for r in rows if int(r["round"]) == last]
            for name in ("attention", "selection"):
                npy = done[0].dir / f"{name}.npy"
                if npy.is_file():
                    import numpy as np

                    # a cell copied without its config.json (e.g. committed by hand) still
                    # gets its heatmap, without the group order
                    conf = done[0].dir / "config.json"
                    values = json.loads(conf.read_text()).get("values", {}) \
                        if conf.is_file() else {}
                    written.append(plots.heatmap(
                        np.load(npy), out / f"heatmap-{setting}-{strategy}-{name}.png",
                        title=f"{strategy} {name}, {setting}, seed {done[0].seed}",
                        groups=true_groups(values) if values else None))
        if curves:
            written.append(plots.curves(curves, out / f"curves-{setting}.png",
                                        title=f"{matrix.name} / {setting}", metric=metric))
            written.append(plots.distribution(dist, out / f"clients-{setting}.png",
                                              title=f"{matrix.name} / {setting}: per-client, "
                                              f"final round, all seeds", metric=metric))
    return written


# --------------------------------------------------------------------------------- CLI
def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="flower-pfl bench", description=__doc__.split("\n")[0])
    p.add_argument("matrix", help="the matrix YAML file (see benchmarks/*.yaml)")
    p.add_argument("--out", default=None,
                   help="output folder (default: bench-results/<matrix name> in the cwd)")
    p.add_argument("--strategies", nargs="+", help="run only these strategies' cells")
    p.add_argument("--settings", nargs="+", help="run only these settings' cells")
    p.add_argument("--seeds", nargs="+", type=int, help="run only these seeds' cells")
    p.add_argument("--table-only", action="store_true", help="run nothing; rewrite table/plots")
    p.add_argument("--superlink", choices=("shared", "per-cell"), default="shared",
                   help="one SuperLink for all cells (default) or one per run")
    p.add_argument("--ray", choices=("per-run", "shared"), default="per-run",
                   help="each run starts its own Ray instance (default, as flower-pfl run) or "
                   "all runs attach to one started for the bench (needs --superlink shared)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one key in every cell (repeatable), e.g. --set rounds=20; "
                   "recorded in each cell.yaml and in table.md")
    p.add_argument("--timeout", type=float, default=None, help="seconds per cell before failing")
    p.add_argument("--retries", type=int, default=1,
                   help="run a failed or invalid (clients failed) cell again up to N times")
    p.add_argument("--echo", action="store_true", help="echo Flower's log of every run")
    args = p.parse_args(argv)
    try:
        matrix = load_matrix(args.matrix, config_mod.parse_overrides(args.set))
    except (MatrixError, config_mod.ConfigError) as exc:
        print(f"flower-pfl bench: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("bench-results") / matrix.name).resolve()
    if args.table_only:
        cells = matrix.cells(out)
        records = collect(matrix, cells)
        out.mkdir(parents=True, exist_ok=True)
        write_table(matrix, records, out)
        write_plots(matrix, cells, records, out)
        print(f"[bench] table: {out / 'table.md'}")
        return 0
    only = {"strategy": args.strategies, "setting": args.settings, "seed": args.seeds}
    # Ctrl-C, SIGTERM and SIGHUP all unwind through the SuperLink/Ray contexts (every process
    # stopped by PID); SIGINT is re-enabled because a shell's background job inherits it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        records = run_bench(matrix, out, args.superlink, args.echo, args.timeout, only,
                            ray=args.ray, retries=args.retries)
    except KeyboardInterrupt:
        print("flower-pfl bench: interrupted; processes stopped (rerun to resume)",
              file=sys.stderr)
        return 130
    return 1 if any(r["status"] == "failed" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
