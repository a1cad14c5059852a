"""Same per-client metrics, bit for bit, in this working tree and at an older revision.

Checks out ``--rev`` (default e7f4d0d) in a temporary ``git worktree`` (removed afterwards),
runs every strategy in process on the same small configuration in both trees -- one
subprocess per tree, its ``sys.path[0]`` that tree, one torch and BLAS thread, the cache
in a temporary folder -- and compares ``clients.csv`` and ``rounds.csv`` value by value
(timing columns left out).  Prints per strategy ``identical`` or how many values differ
and the largest absolute / relative difference; exit status 1 when any value differs.

    .venv/bin/python benchmarks/same_metrics.py                      # e7f4d0d, six strategies
    .venv/bin/python benchmarks/same_metrics.py --rev HEAD~3 fedamp heurfedamp \
        --set fraction-fit=0.5 --set model=cnn
    .venv/bin/python benchmarks/same_metrics.py --rev main fedavg --new-set device-resident=always
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from flower_pfl.reporting.run_files import read_rows

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ["fedamp", "heurfedamp", "fedacs", "selffl", "scaffold", "ditto"]
FILES = ("clients", "rounds")
#: 6 clients, 2 sampled per round (so the stores' Gram rows are refreshed incrementally)
CONFIG = {"rounds": 3, "clients": 6, "fraction-fit": 0.34, "model": "mclr", "seed": 0,
          "eval-every": 1, "checkpoint-every": 0,
          "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 1500},
          "train": {"epochs": 1, "batch-size": 50, "lr": 0.05}}

# Run in a tree: python -c CHILD TREE OUT JSON.  Old trees have flower_pfl/inprocess.py.
CHILD = r"""
import json, logging, sys
tree, out, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path[0] = tree
import torch
torch.set_num_threads(1)
import flower_pfl
from flower_pfl import config
assert flower_pfl.__file__.startswith(tree), flower_pfl.__file__
try:
    from flower_pfl.running import inprocess
except ImportError:
    from flower_pfl import inprocess
logging.getLogger("flwr").setLevel(logging.WARNING)
for name in spec["strategies"]:
    cfg = config.validate({**spec["config"], "strategy": name}, source="same_metrics")
    inprocess.run(cfg, f"{out}/{name}")
"""


def is_timing(column: str) -> bool:
    return column.endswith("_s") or "rss" in column or column in ("time", "timestamp")


def with_changes(tree: dict, changes: list[str]) -> dict:
    """``CONFIG`` with KEY=VALUE changes (dotted keys; values as YAML/JSON scalars)."""
    tree = json.loads(json.dumps(tree))
    for change in changes:
        key, _, text = change.partition("=")
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        try:
            node[leaf] = json.loads(text)
        except ValueError:
            node[leaf] = text
    return tree


def run_tree(tree: Path, out: Path, strategies: list[str], cfg: dict) -> None:
    env = {**os.environ, "FLOWER_PFL_CACHE": str(out / "cache"), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    spec = json.dumps({"strategies": strategies, "config": cfg})
    subprocess.run([sys.executable, "-c", CHILD, str(tree), str(out), spec], cwd=tree, env=env,
                   check=True)


def compare(old_dir: Path, new_dir: Path) -> tuple[int, int, float, float, list[str]]:
    """(values compared, values differing, max |a - b|, max |a - b| / |a|, notes)."""
    total = diff = 0
    max_abs = max_rel = 0.0
    notes = []
    for name in FILES:
        old, new = read_rows(old_dir, name), read_rows(new_dir, name)
        if len(old) != len(new) or not old:
            notes.append(f"{name}.csv: {len(old)} vs {len(new)} rows")
        if not old or not new:
            continue
        common = [c for c in old[0] if c in new[0] and not is_timing(c)]
        only = sorted(set(old[0]) ^ set(new[0]))
        if only:
            notes.append(f"{name}.csv: columns in one tree only {only}")
        for a, b in zip(old, new):
            for c in common:
                total += 1
                if a[c] == b[c]:
                    continue
                diff += 1
                try:
                    x, y = float(a[c]), float(b[c])
                except ValueError:
                    notes.append(f"{name}.csv {c}: {a[c]!r} vs {b[c]!r}")
                    continue
                if math.isfinite(x) and math.isfinite(y):
                    max_abs = max(max_abs, abs(x - y))
                    max_rel = max(max_rel, abs(x - y) / abs(x) if x else math.inf)
    return total, diff, max_abs, max_rel, notes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("strategies", nargs="*", default=STRATEGIES)
    p.add_argument("--rev", default="e7f4d0d", help="the older revision (default e7f4d0d)")
    p.add_argument("--new", default=str(ROOT), help="the newer tree (default: this one)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--new-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a change for the newer tree only (a key the older one lacks, e.g. "
                   "device-resident=always)")
    args = p.parse_args()
    cfg = with_changes(CONFIG, args.set)
    new_cfg = with_changes(cfg, args.new_set)
    with tempfile.TemporaryDirectory(prefix="same-metrics-") as tmp:
        old_tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet",
                        str(old_tree), args.rev], check=True)
        try:
            run_tree(old_tree, Path(tmp) / "old", args.strategies, cfg)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(old_tree)], check=False)
        run_tree(Path(args.new).resolve(), Path(tmp) / "new", args.strategies, new_cfg)
        print(f"{args.rev} vs {args.new}: {', '.join(f + '.csv' for f in FILES)}, "
              f"{json.dumps(cfg)}" + (f"; newer tree also {args.new_set}" if args.new_set
                                      else ""))
        print(f"{'strategy':12s} {'values':>7s} {'differ':>7s} {'max_abs':>10s} {'max_rel':>10s}")
        failed = False
        for name in args.strategies:
            total, diff, max_abs, max_rel, notes = compare(Path(tmp) / "old" / name,
                                                           Path(tmp) / "new" / name)
            failed |= bool(diff or notes)
            line = "identical" if not diff else f"{diff:7d} {max_abs:10.3g} {max_rel:10.3g}"
            print(f"{name:12s} {total:7d} {line}")
            for note in notes:
                print(f"    {note}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
