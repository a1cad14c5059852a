"""What a result cell keeps when it is committed (docs/results/): what the tables, the pairs
and the figures read, and what a reader opens -- nothing that repeats it.

A finished run writes, beside its summary, its full logs: every client's row of every
evaluated round (clients.csv), every upload (fit.csv), the server's per-round log twice
(server.csv and summary.json's "server"), the round statistics twice (rounds.csv and
summary.json's "rounds") and its own figures.  ``flower-pfl bench --table-only`` reads

* summary.json: status, final statistics, BMTA, the per-round statistics (curves,
  s/round) -- kept, one line per round, without its copy of server.csv;
* clients.csv: the last evaluated round's rows (worst-k, the per-client figure, the
  heatmaps' untrained clients) and the row count per round (the failure check) -- kept as
  the last round's rows, *only* when every evaluated round has a row per client (so the
  failure check reads the same); a run with short rounds keeps the whole file;
* server.csv (fit failures), config.json, cell.yaml, bench-cell.json, the saved matrices
  (*.npy) and small per-strategy logs -- kept.

Dropped: fit.csv, rounds.csv, the run's own PNGs, summary.json's "server".  The cell's
command (cell.yaml) regenerates them.  Slimming changes no number of any table: the test
regenerates every committed table byte for byte from the slim cells.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from flower_pfl.atomic import atomic_write, atomic_write_text
from flower_pfl.reporting.results import read_rows, read_summary, read_values

#: the files a slim cell does not keep (the cell's command rewrites them)
DROPPED = ("fit.csv", "rounds.csv")


def slim_cell(cell_dir: Path) -> int:
    """Slim one run folder in place; returns the bytes it saved.  For runs that ended (a run
    that died keeps "running" as its status and is slimmed like the others; the bench reruns
    such a cell in a fresh folder); a folder without summary.json is left as it is."""
    cell_dir = Path(cell_dir)
    summary = read_summary(cell_dir)
    if not summary:
        return 0
    before = folder_bytes(cell_dir)
    for name in DROPPED:
        (cell_dir / name).unlink(missing_ok=True)
    for png in cell_dir.glob("*.png"):
        png.unlink()
    summary.pop("server", None)
    # one line per round (the run's own summary.json is indented: 2-3x the bytes)
    rounds = summary.pop("rounds", [])
    text = json.dumps(summary, indent=1, sort_keys=True)
    lines = ",\n  ".join(json.dumps(r, sort_keys=True) for r in rounds)
    atomic_write_text(cell_dir / "summary.json",
                      text[:-2] + f',\n "rounds": [\n  {lines}\n ]\n}}\n' if rounds else text)
    keep_last_round_of_clients(cell_dir)
    return before - folder_bytes(cell_dir)


def keep_last_round_of_clients(cell_dir: Path) -> None:
    """clients.csv cut to its last evaluated round, when every evaluated round has one row
    per configured client (else the whole file stays: the failure check needs it)."""
    rows = read_rows(cell_dir, "clients")
    if not rows:
        return
    n = int((read_values(cell_dir) or {}).get("clients", 0)) \
        if (cell_dir / "config.json").is_file() else 0
    per_round: dict[str, int] = {}
    for r in rows:
        per_round[r["round"]] = per_round.get(r["round"], 0) + 1
    if n <= 0 or any(count != n for count in per_round.values()):
        return
    last = max(int(r["round"]) for r in rows)
    path = cell_dir / "clients.csv"
    with open(path, newline="") as fh:
        fields = next(csv.reader(fh))

    def write(fh) -> None:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(r for r in rows if int(r["round"]) == last)

    atomic_write(path, write)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def slim_tree(root: Path) -> tuple[int, int]:
    """Slim every run folder (a folder with summary.json) under ``root``: (runs, bytes saved)."""
    runs = saved = 0
    for summary in sorted(Path(root).rglob("summary.json")):
        saved += slim_cell(summary.parent)
        runs += 1
    return runs, saved
