"""Run a bench matrix's cells in one process each, several at once, into the bench's layout.

`flower-pfl bench` runs each cell through Flower's simulation engine (`flwr run`, Ray), one
cell at a time: the experiment of record.  On a machine with many cores and a GPU, a matrix
of small-model cells is bound by one simulation's start and by its one-round-at-a-time
clients; this script runs the same cells (the same ``cell.yaml`` the bench writes, the same
Strategy and NumPyClient classes) through ``flower_pfl.running.inprocess`` -- the direct-call
transport the tests use -- with ``--jobs`` cells at a time, each in its own process (with
``device: auto`` on the GPU where there is one).  Each finished cell's ``bench-cell.json``
says ``"engine": "inprocess"`` and the table marks its row, so a table never passes an
in-process cell off as a `flwr run` one.  Finished cells are skipped as by the bench, and
`flower-pfl bench MATRIX --out DIR --table-only` (run at the end) writes table.md and plots.

``--deadline S``: the cells must end within S seconds (e.g. a lent machine's time limit).
Every 5 s the remaining time of each running cell is projected from its last rounds; while
the latest projected end lies past the deadline, the running cell of lowest priority (last
in ``--strategies``) is stopped, at most one per ``--grace`` seconds (the others speed up
when it goes).  A stopped cell keeps its partial files but gets no number ("not run").

    python benchmarks/matrix_inprocess.py benchmarks/fedamp-table3.yaml --seeds 0 \
        --strategies fedamp heurfedamp local fedavg-ft --jobs 4 --out DIR [--deadline 540]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flower_pfl import config as config_mod
from flower_pfl.matrix import Cell, MatrixError, load_matrix
from flower_pfl.reporting.run_files import read_summary
from flower_pfl.running import bench


def run_cell(cell_dir: Path, t0: float) -> int:
    """Child: run one prepared cell (its cell.yaml) in this process; ``t0``: when the parent
    started the process (its wall time counts the interpreter's start and imports)."""
    import torch

    from flower_pfl.running import inprocess

    try:
        cfg = config_mod.load(cell_dir / "cell.yaml")
        strategy = inprocess.run(cfg, cell_dir)
        status = strategy.results.status
    except Exception:  # noqa: BLE001 - recorded for the table, as the bench does
        (cell_dir / "bench-error.txt").write_text(traceback.format_exc())
        status = "failed"
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    (cell_dir / "bench-cell.json").write_text(json.dumps(
        {"status": status, "wall_s": round(time.time() - t0, 2), "engine": "inprocess",
         "device": device, "torch_threads": torch.get_num_threads()}, indent=2))
    return 0 if status == "completed" else 1


def projected_end(cell: Cell, now: float) -> float | None:
    """When the cell will finish at the pace of its last rounds (None: too early to tell)."""
    rows = (read_summary(cell.dir) or {}).get("rounds") or []
    if len(rows) < 2:
        return None
    a, b = rows[max(0, len(rows) - 4)], rows[-1]
    per_round = (b["elapsed_s"] - a["elapsed_s"]) / max(b["round"] - a["round"], 1)
    return now + per_round * (int(cell.tree["rounds"]) - b["round"])


def to_stop(running: list[str], ends: dict[str, float | None], now: float, deadline: float,
            last_stop: float, grace: float) -> list[str]:
    """Which running cells (listed by priority, highest first) to stop now: all of them once
    the deadline has passed; else, while some cell's projected end lies past the deadline,
    the lowest-priority one, at most one per ``grace`` seconds."""
    if now >= deadline:
        return list(running)
    late = any(e is not None and e > deadline for e in ends.values())
    return [running[-1]] if running and late and now - last_stop >= grace else []


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("matrix", nargs="?")
    p.add_argument("--out", required=False)
    p.add_argument("--strategies", nargs="+", help="these strategies, in priority order")
    p.add_argument("--settings", nargs="+")
    p.add_argument("--seeds", nargs="+", type=int)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--deadline", type=float, default=None, help="seconds from the start")
    p.add_argument("--grace", type=float, default=45.0)
    p.add_argument("--cell", help=argparse.SUPPRESS)  # child mode
    p.add_argument("--started", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.cell:
        return run_cell(Path(args.cell), args.started or time.time())
    if not (args.matrix and args.out):
        p.error("MATRIX and --out are required")
    try:
        matrix = load_matrix(args.matrix, config_mod.parse_overrides(args.set))
    except (MatrixError, config_mod.ConfigError) as exc:
        print(f"matrix_inprocess: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    cells = matrix.cells(out)
    todo = bench.to_run(cells, {c.key: bench.cell_state(c) for c in cells},
                        {"strategy": args.strategies, "setting": args.settings,
                         "seed": args.seeds})
    todo.sort(key=lambda c: c.seed)  # stable: every seed-0 cell before any seed-1 cell
    print(f"[inprocess] {matrix.name}: {len(todo)} cells to run, {args.jobs} at a time -> {out}",
          flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                          os.environ.get("PYTHONPATH", "")])}
    start = time.time()
    deadline = start + args.deadline if args.deadline else None
    running: dict[str, tuple[Cell, subprocess.Popen]] = {}
    stopped: list[str] = []
    last_stop, last_check, ticks = 0.0, 0.0, 0
    queue = list(todo)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        while queue or running:
            while queue and len(running) < args.jobs:
                cell = queue.pop(0)
                bench.prepare(cell)
                log = open(cell.dir / "inprocess.log", "w")
                running[cell.key] = (cell, subprocess.Popen(
                    [sys.executable, __file__, "--cell", str(cell.dir), "--started",
                     repr(time.time())], stdout=log,
                    stderr=subprocess.STDOUT, env=env))
                log.close()  # the child holds its own copy
                print(f"[inprocess] {cell.key}: started ({time.time() - start:.0f} s)", flush=True)
            time.sleep(0.5)  # a finished cell's slot is refilled at once
            now = time.time()
            for key, (done_cell, proc) in list(running.items()):
                if proc.poll() is not None:
                    del running[key]
                    if proc.returncode == 0 and bench.under_docs(out):
                        bench.slim_cell(done_cell.dir)  # docs/results keeps slim cells
                    print(f"[inprocess] {key}: {'completed' if proc.returncode == 0 else 'FAILED'}"
                          f" ({now - start:.0f} s)", flush=True)
            if deadline is None or not running or now - last_check < 5:
                continue
            last_check, ticks = now, ticks + 1
            ends = {k: projected_end(c, now) for k, (c, _) in running.items()}
            victims = to_stop(list(running), ends, now, deadline, last_stop, args.grace)
            if victims:
                queue.clear()  # nothing new starts once the deadline is at risk
                for key in victims:
                    cell, proc = running.pop(key)
                    proc.send_signal(signal.SIGTERM)
                    proc.wait()
                    stopped.append(key)
                    end = ends[key] - start if ends.get(key) else float("nan")
                    print(f"[inprocess] {key}: stopped for the deadline ({now - start:.0f} s;"
                          f" projected end {end:.0f} s)", flush=True)
                last_stop = now
            elif ticks % 12 == 0:
                print("[inprocess] projected ends (s): " + ", ".join(
                    f"{k.split('/')[1]} {e - start:.0f}" if e else f"{k.split('/')[1]} ?"
                    for k, e in ends.items()), flush=True)
    finally:  # interrupted: no cell outlives this script
        for _, proc in running.values():
            proc.terminate()
            proc.wait()
    print(f"[inprocess] done in {time.time() - start:.0f} s; stopped: {stopped or 'none'}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
