"""``flower-pfl bench MATRIX.yaml``: run a matrix's cells, resume where it stopped.

Every cell of a :class:`~.matrix.Matrix` is one ``flwr run`` in Ray simulation (the
``flower-pfl run`` path) on its own YAML, ``<out>/runs/<setting>/<strategy>/seed-<s>/
cell.yaml``, written in full before the run: ``flower-pfl run --config <that file>``
reproduces the cell alone. A cell whose ``summary.json`` says ``completed`` for an identical
``cell.yaml`` is skipped on a rerun, so an interrupted bench resumes where it stopped; a
changed cell configuration -- or a changed registry default it resolves to (its
``config.json``) -- reruns.  A run that completed while clients failed
(:func:`flower_pfl.reporting.coverage.client_failures`) is no number and reruns.

All cells of one bench share ONE SuperLink (``--superlink per-cell`` starts one per run, as
``flower-pfl run`` does); ``--ray shared`` also starts ONE Ray instance
(:mod:`flower_pfl.running.rayhead`) that every cell's simulation attaches to (``RAY_ADDRESS``)
instead of a Ray start and stop per run. See docs/BENCHMARKS.md (a) for what each saves.
A failed run (e.g. Ray's start timed out) or one in which clients failed is run again up
to ``retries`` times; a configuration error is not retried.

When the cells have run, :mod:`flower_pfl.reporting.tables` writes the table, the paired
comparisons and the figures.  The matrix format: :mod:`flower_pfl.matrix` (validated whole
before any cell runs) and docs/bench.md.  What the console shows (cell k of N, the round
inside the current cell): :class:`flower_pfl.reporting.console.BenchConsole`, handed in as
``progress``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
import time
import zipfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol, Sequence

import yaml

from flower_pfl import config as config_mod
from flower_pfl.config import APP_DIR
from flower_pfl.hyper import read_yaml
from flower_pfl.matrix import Cell, Matrix
from flower_pfl.reporting.coverage import client_failures
from flower_pfl.reporting.log_lines import fmt_s
from flower_pfl.reporting.results import mark_failed
from flower_pfl.reporting.run_files import SERIES, read_json, read_summary
from flower_pfl.reporting.tables import collect, write_plots, write_table
from flower_pfl.running.launch import federation_config, run_simulation, simulation_superlink
from flower_pfl.running.procs import LaunchError, OnLine, ProcessSet, RunOutcome, flwr_run
from flower_pfl.running.rayhead import shared_ray

if TYPE_CHECKING:  # the command line hands it in; not imported at run time
    from flower_pfl.reporting.console import BenchConsole


class BenchLog(Protocol):
    """Where :func:`run_bench` writes its ``[bench]`` lines: ``print`` or a console's ``log``."""

    def __call__(self, text: str, /, *, flush: bool) -> object: ...


# ------------------------------------------------------------------------------- cells
def cell_yaml(cell: Cell) -> str:
    """The text of the cell's ``cell.yaml``: its tree, with where its results go."""
    tree = dict(cell.tree or {})
    tree["output-dir"] = str(cell.dir.parent)
    tree["run-name"] = cell.dir.name
    return yaml.safe_dump(tree, sort_keys=True)


# Where and how a cell ran -- its folders, the data files' folder, the device and resources,
# tracking, time limits, checkpoints, where the server keeps client models -- not what it
# ran: a finished cell moved or copied (committed into docs/results/, then cloned; run on a
# lent GPU with --set data.root=...) is still done where it now sits.
WHERE = {"output-dir", "run-name", "cache-dir", "data.root", "device", "device-resident",
         "tracking", "tracking-dir", "client-resources.num-cpus", "client-resources.num-gpus",
         "round-timeout", "stall-timeout", "checkpoint-every", "server.model-store",
         "server.memory-budget-mb"}


def defaults_unchanged(cell: Cell, text: str) -> bool:
    """Whether the run's resolved configuration (its ``config.json``: the cell.yaml with the
    registry's defaults filled in) is what the cell.yaml resolves to today.  The strategy's
    hyper-parameters are compared whole: a changed default or a hyper-parameter added since
    (FedAMP's ``evaluate``) reruns the cell.  Of the run settings, only keys the run had are
    compared (a setting added later, e.g. a timeout, did not change what ran), and not
    ``WHERE`` it ran.  A cell without config.json (copied by hand) is judged on its
    cell.yaml alone."""
    path = cell.dir / "config.json"
    if not path.is_file():
        return True
    then = read_json(path)
    if not isinstance(then, dict):
        return False
    now = json.loads(config_mod.validate(read_yaml(text), str(cell.dir)).to_json())
    if then.get("hyper") != now["hyper"]:
        return False
    old = then.get("values", {})
    return all(old[k] == v for k, v in now["values"].items() if k in old and k not in WHERE)


def same_run(text: str, other: str) -> bool:
    """Whether two cell.yaml texts resolve (today's defaults filled in) to the same run, but
    for ``WHERE`` it ran."""
    resolved = []
    for t in (text, other):
        try:
            tree = read_yaml(t)
            if not isinstance(tree, dict):
                return False
            cfg = json.loads(config_mod.validate(tree, "cell.yaml").to_json())
        except (yaml.YAMLError, config_mod.ConfigError, ValueError, TypeError):
            return False
        resolved.append((cfg["hyper"], {k: v for k, v in cfg["values"].items()
                                        if k not in WHERE}))
    return resolved[0] == resolved[1]


def cell_state(cell: Cell) -> str:
    """'not registered', 'done' (completed, all clients every round, for this cell's run under
    today's defaults, wherever it ran: :func:`same_run`) or 'todo'."""
    if cell.tree is None:
        return "not registered"
    summary, yml = read_summary(cell.dir), cell.dir / "cell.yaml"
    text = cell_yaml(cell)
    if summary and summary.get("status") == "completed" and yml.is_file() \
            and same_run(yml.read_text(), text) and defaults_unchanged(cell, text) \
            and client_failures(cell.dir) is None:
        return "done"
    return "todo"


def to_run(cells: Sequence[Cell], states: Mapping[str, str],
           only: Mapping[str, Sequence[object] | None]) -> list[Cell]:
    """The cells still to run ('todo') among those selected by ``only`` (strategy / setting /
    seed lists; None or empty = all), in the order the strategies were asked for (e.g. the
    method of interest first)."""
    todo = [c for c in cells if states[c.key] == "todo" and
            all(not (chosen := only.get(k)) or v in chosen for k, v in
                (("strategy", c.strategy), ("setting", c.setting), ("seed", c.seed)))]
    order = only.get("strategy")
    if order:
        todo.sort(key=lambda c: list(order).index(c.strategy))
    return todo


def prepare(cell: Cell) -> tuple[config_mod.RunConfig, Path]:
    """An empty cell folder with its ``cell.yaml`` (results files append: a rerun starts
    from nothing); returns the validated configuration and the YAML's path."""
    if cell.dir.exists():
        shutil.rmtree(cell.dir)
    cell.dir.mkdir(parents=True)
    path = cell.dir / "cell.yaml"
    path.write_text(cell_yaml(cell))
    return config_mod.load(path), path


def check_cells(cells: Sequence[Cell], out: Path | None = None) -> None:
    """The cells' settings this machine cannot run, judged before anything starts
    (:func:`flower_pfl.reliability.preflight.check_before_start` in scope ``simulation``:
    the device and client resources, the folders each cell writes, the data sizes; the CUDA
    probe once, in a child, where a cell needs it).  Raises PreflightError: one line per
    problem with the cells it concerns; ``out`` (the bench's folder) where it cannot be
    made or written."""
    from flower_pfl.reliability import preflight

    values = {c.key: config_mod.validate(read_yaml(cell_yaml(c)), c.key).values
              for c in cells if c.tree is not None}
    probe = any(preflight.needs_cuda(v) for v in values.values())
    machine = preflight.this_machine_apart(probe) if values else None
    found: dict[str, list[str]] = {}
    for key, v in values.items():
        for line in preflight.start_problems(v, "simulation", None, machine):
            found.setdefault(line, []).append(key)
    lines = [f"{line} [cell(s) {', '.join(keys[:3])}"
             f"{f' and {len(keys) - 3} more' if len(keys) > 3 else ''}]"
             for line, keys in found.items()]
    lines = preflight.output_problems(out) + lines
    preflight.raise_problems(lines)


def run_on(superlink: tuple[dict[str, str], ProcessSet], cfg: config_mod.RunConfig, path: Path,
           cell: Cell, echo: bool, timeout_s: float | None,
           on_line: OnLine | None = None) -> RunOutcome:
    """One cell's ``flwr run`` on an already running simulation SuperLink."""
    env, procs = superlink
    run_config: dict[str, str | bool] = {"cfg": cfg.to_json(), "config-file": str(path),
                                         "overrides": "", "results-dir": str(cell.dir)}
    return flwr_run(run_config, cell.dir, env, procs, cell.dir / "flwr-run.log",
                    federation_config=federation_config(cfg), app_dir=APP_DIR, echo=echo,
                    timeout_s=timeout_s, on_line=on_line)


# -------------------------------------------------------------------------------- slim
# A cell kept in docs/results/ keeps what recomputes the tables and what a reader opens:
# cell.yaml, config.json, bench-cell.json, run-config.toml, a compact summary.json (final
# metrics, BMTA, status, wall time; its rounds cut to the first and last, which give
# s/round), clients.csv cut to its last evaluated round (the per-client final values), and
# the per-round series (rounds.csv, server.csv, peers.csv, selffl_clients.csv) in one
# compressed SERIES file.  Dropped: every round's per-client rows (clients.csv, fit.csv)
# the per-cell figures and the checkpoint folder -- the cell's cell.yaml regenerates them.
IN_SERIES = ("rounds", "server", "peers", "selffl_clients")
DROPPED = ("fit.csv", "curves.png", "attention.png", "selection.png", "flwr-run.log",
           "inprocess.log")


def slim_cell(cell_dir: Path) -> bool:
    """Cut one cell folder that has ended (finished, or stopped for good: a diverged
    ablation) to what docs/results keeps (above); the tables and the done check read the
    same numbers from it.  Idempotent; False where the folder holds no summary.json (left
    as it is).  Not for a run still writing its files."""
    cell_dir = Path(cell_dir)
    summary = read_summary(cell_dir)
    if not isinstance(summary, dict):
        return False
    members = {f"{name}.csv": cell_dir / f"{name}.csv" for name in IN_SERIES
               if (cell_dir / f"{name}.csv").is_file()}
    if members:
        archive = cell_dir / SERIES
        old = {}
        if archive.is_file():
            with zipfile.ZipFile(archive) as zf:
                old = {n: zf.read(n) for n in zf.namelist()}
        old.update({n: p.read_bytes() for n, p in members.items()})
        tmp = archive.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_LZMA) as zf:
            for name in sorted(old):
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_LZMA
                zf.writestr(info, old[name])
        tmp.replace(archive)
        for p in members.values():
            p.unlink()
    clients = cell_dir / "clients.csv"
    if clients.is_file():
        with open(clients, newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            rows = list(reader)
        if header and rows:
            col = header.index("round")
            last = max(int(r[col]) for r in rows)
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerow(header)
            writer.writerows(r for r in rows if int(r[col]) == last)
            clients.write_text(buf.getvalue())
    rounds = summary.get("rounds") or []
    compact = {k: v for k, v in summary.items() if k not in ("rounds", "server", "rounds_total")}
    compact["rounds"] = rounds[:1] + rounds[1:][-1:]
    compact["rounds_total"] = summary.get("rounds_total", len(rounds))
    (cell_dir / "summary.json").write_text(json.dumps(compact, indent=1))
    for name in DROPPED:
        (cell_dir / name).unlink(missing_ok=True)
    shutil.rmtree(cell_dir / "checkpoint", ignore_errors=True)  # the run's resume state
    return True


def slim_tree(root: Path) -> int:
    """:func:`slim_cell` every cell folder (one with a summary.json) under ``root``; the
    number slimmed."""
    return sum(slim_cell(p.parent) for p in sorted(Path(root).rglob("summary.json")))


def under_docs(out: Path) -> bool:
    """Whether ``out`` lies in a ``docs/results`` folder (cells written there are slimmed)."""
    parts = Path(out).resolve().parts
    return any(parts[i:i + 2] == ("docs", "results") for i in range(len(parts) - 1))


# --------------------------------------------------------------------------------- run
@contextmanager
def environ(key: str, value: str) -> Iterator[None]:
    """``os.environ[key] = value`` inside the block; the old value (or none) after it."""
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def run_bench(matrix: Matrix, out: Path, superlink: str = "shared", echo: bool = False,
              timeout_s: float | None = None,
              only: Mapping[str, Sequence[object] | None] | None = None,
              log: BenchLog = print, ray: str = "per-run", retries: int = 1,
              progress: BenchConsole | None = None) -> list[dict[str, Any]]:
    """Run every cell not done yet (optionally only some strategies/settings/seeds), then
    write the table and plots. Returns one record per cell of the matrix.

    A cell whose run failed (e.g. Ray's start timed out) or in which clients failed is run
    again up to ``retries`` times; a configuration error is not retried.  ``progress``
    (a :class:`~flower_pfl.reporting.console.BenchConsole`) is told which cell runs
    (``cell(k, key, rounds)``), gets every output line of its run (``feed``) and the
    cells done (``cells_done(k, eta)``)."""
    cells = matrix.cells(out)
    states = {c.key: cell_state(c) for c in cells}
    todo = to_run(cells, states, only or {})
    check_cells(todo, out)  # before any folder, SuperLink or Ray: a refused bench leaves nothing
    out.mkdir(parents=True, exist_ok=True)
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
                f"{fmt_s(t0 - started)})", flush=True)
            for attempt in range(retries + 1):
                retry = False
                try:
                    cfg, path = prepare(cell)
                    if progress is not None:
                        progress.cell(k, cell.key, int(cfg["rounds"]))
                    on_line = progress.feed if progress is not None else None
                    if superlink == "shared":
                        if shared is None:
                            wd = Path(tempfile.mkdtemp(prefix="flower-pfl-bench-"))
                            stack.callback(shutil.rmtree, wd, True)
                            if ray == "shared":  # before the SuperLink: it inherits RAY_ADDRESS
                                address = stack.enter_context(shared_ray(wd, out / "ray.log"))
                                stack.enter_context(environ("RAY_ADDRESS", address))
                            shared = stack.enter_context(
                                simulation_superlink(wd, out / "superlink.log"))
                        run_on(shared, cfg, path, cell, echo=echo, timeout_s=timeout_s,
                               on_line=on_line)
                    else:
                        run_simulation(cfg, path, [], cell.dir, timeout_s=timeout_s, echo=echo,
                                       on_line=on_line)
                    why = client_failures(cell.dir)
                    status = "completed" if why is None else "invalid"
                    if why is not None:
                        (cell.dir / "bench-error.txt").write_text(f"clients failed: {why}\n")
                        retry = True
                except config_mod.ConfigError as exc:  # deterministic: retrying cannot help
                    status = "failed"
                    (cell.dir / "bench-error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
                    mark_failed(cell.dir, exc)  # a summary.json left 'running' says so too
                except (LaunchError, OSError) as exc:  # e.g. Ray's start timed out under load
                    status = "failed"
                    (cell.dir / "bench-error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
                    mark_failed(cell.dir, exc)
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
            if progress is not None:
                progress.cells_done(k, eta if left else 0)
            log(f"[bench] cell {k}/{n} {cell.key}: {status} in {fmt_s(wall)} | elapsed "
                f"{fmt_s(time.time() - started)} | est. left {fmt_s(eta if left else 0)} "
                f"({len(left)} cells to run)", flush=True)
            if status != "completed":
                log(f"[bench]   {(cell.dir / 'bench-error.txt').read_text().strip()[:500]}",
                    flush=True)
    if under_docs(out):
        for cell in cells:
            if states[cell.key] == "done":
                slim_cell(cell.dir)
    records = collect(matrix, cells)
    write_table(matrix, records, out)
    write_plots(matrix, cells, records, out)
    log(f"[bench] table: {out / 'table.md'}", flush=True)
    return records
