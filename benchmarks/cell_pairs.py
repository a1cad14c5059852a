"""Paired A - B over seeds from a matrix's committed cells, in any column: BMTA, final
mean, weighted mean, worst 10% / 5%, the global model's mean, or the cell's wall time.

docs/RESULTS.md quotes numbers the matrices' pairs.csv does not hold (a BMTA pair where the
matrix compares final means; a wall time); this recomputes each of them from the cells:

    python benchmarks/cell_pairs.py docs/results/fedamp-table3 practical-3groups \
        fedamp local --metric bmta --rev 8526ded

``--rev`` reads the cells as committed at that revision (``git show REV:path``), so the
numbers recompute after docs/results changes; without it the working tree is read.  The
interval is the bench's (flower_pfl.reporting.stats.paired_interval: 95% Student t over
the seeds both cells finished); "±h" is its half width, the smallest A - B that the
interval would tell from 0 at these seeds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from flower_pfl.reporting.stats import is_unresolved, mean_std, paired_interval, verdict

# metric -> (file in the cell, how to read it, scale to percent)
METRICS = {
    "bmta": ("summary.json", lambda s: s["bmta"], 100.0),
    "final": ("summary.json", lambda s: s["final"]["personal_mean"], 100.0),
    "weighted": ("summary.json", lambda s: s["final"]["personal_weighted_mean"], 100.0),
    "worst10": ("summary.json", lambda s: s["final"]["personal_worst10_mean"], 100.0),
    "worst5": ("summary.json", lambda s: s["final"]["personal_worst5_mean"], 100.0),
    "global": ("summary.json", lambda s: s["final"]["global_mean"], 100.0),
    "wall_s": ("bench-cell.json", lambda s: s["wall_s"], 1.0),
}


class CellReader:
    """Reads cell files from the working tree or, with ``rev``, from git at that revision."""

    def __init__(self, rev: str | None, repo: Path) -> None:
        self.rev, self.repo = rev, repo

    def list_dir(self, path: str) -> list[str]:
        if self.rev is None:
            p = self.repo / path
            return sorted(x.name for x in p.iterdir()) if p.is_dir() else []
        out = subprocess.run(["git", "ls-tree", "--name-only", f"{self.rev}:{path}"],
                             cwd=self.repo, capture_output=True, text=True)
        return sorted(out.stdout.split()) if out.returncode == 0 else []

    def read_json(self, path: str) -> dict | None:
        if self.rev is None:
            p = self.repo / path
            return json.loads(p.read_text()) if p.is_file() else None
        out = subprocess.run(["git", "show", f"{self.rev}:{path}"], cwd=self.repo,
                             capture_output=True, text=True)
        return json.loads(out.stdout) if out.returncode == 0 else None


def seed_values(reader: CellReader, matrix_dir: str, setting: str, strategy: str,
                metric: str) -> dict[int, float]:
    """{seed: value} over the strategy's cells that hold the metric's file."""
    fname, get, scale = METRICS[metric]
    base = f"{matrix_dir.rstrip('/')}/runs/{setting}/{strategy}"
    values = {}
    for name in reader.list_dir(base):
        if not name.startswith("seed-"):
            continue
        data = reader.read_json(f"{base}/{name}/{fname}")
        if data is not None and data.get("status", "completed") == "completed":
            values[int(name[len("seed-"):])] = scale * float(get(data))
    if not values:
        raise SystemExit(f"cell_pairs: no finished cell with {fname} under {base}"
                         + (f" at {reader.rev}" if reader.rev else "")
                         + " (check the matrix folder, setting and strategy names)")
    return values


def describe(a_vals: dict[int, float], b_vals: dict[int, float], seeds: list[int] | None,
             lower_is_better: bool = False) -> str:
    common = sorted(set(a_vals) & set(b_vals))
    if seeds is not None:
        common = [s for s in common if s in seeds]
    if not common:
        return "no seed where both finished"
    a = [a_vals[s] for s in common]
    b = [b_vals[s] for s in common]
    iv = paired_interval(a, b)
    am, asd = mean_std(a)
    bm, bsd = mean_std(b)
    per = ", ".join(f"{d:+.2f}" for d in iv.diffs)
    def show(m: float, sd: float) -> str:
        return f"{m:.2f}" if len(common) == 1 else f"{m:.2f} ± {sd:.2f}"

    text = (f"seeds {','.join(map(str, common))}: A {show(am, asd)}, B {show(bm, bsd)}; "
            f"A − B per seed {per}; mean {iv.mean:+.2f}")
    if iv.half is None:
        return text + " (1 seed: no interval)"
    said = verdict(iv, lower_is_better)  # "not resolved at n seeds (±h)" already says ±h
    return (text + f" [{iv.low:+.2f}, {iv.high:+.2f}]"
            + ("" if is_unresolved(said) else f" (±{iv.half:.2f})") + f"; {said}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("matrix_dir", help="e.g. docs/results/fedamp-table3")
    p.add_argument("setting", help="the matrix setting, e.g. practical-3groups")
    p.add_argument("a", help="strategy A (as named under runs/<setting>/)")
    p.add_argument("b", help="strategy B")
    p.add_argument("--metric", choices=sorted(METRICS), default="bmta")
    p.add_argument("--seeds", type=int, nargs="+", help="only these seeds")
    p.add_argument("--rev", help="read the cells as committed at this git revision")
    p.add_argument("--lower-is-better", action="store_true", help="an error metric")
    args = p.parse_args(argv)
    reader = CellReader(args.rev, Path.cwd())
    a = seed_values(reader, args.matrix_dir, args.setting, args.a, args.metric)
    b = seed_values(reader, args.matrix_dir, args.setting, args.b, args.metric)
    print(f"{args.a} − {args.b} ({args.metric}, {args.setting}): "
          + describe(a, b, args.seeds, args.lower_is_better))
    return 0


if __name__ == "__main__":
    sys.exit(main())
