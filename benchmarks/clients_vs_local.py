"""BMTA at 20 and at the last round, worst-10%, and each client's gap to Local.

Reads the results folders of one comparison (``benchmarks/compare.py --out DIR`` writes
DIR/<strategy>/; a bench cell folder works too, via a folder of links) and prints, per
strategy: BMTA over the first 20 rounds and over all rounds, the final mean, worst-10% at
round 20 and at the end, and the client furthest below its Local accuracy (each client's
accuracy averaged over the last 5 evaluations: one round moves a client by several
points) with the number of clients more than 3 points below Local.  A folder named
``local`` must be among them.

    .venv/bin/python benchmarks/clients_vs_local.py DIR local fedavg-ft fedamp heurfedamp
"""
import csv
import sys
from pathlib import Path

root = Path(sys.argv[1])
strategies = sys.argv[2:]
def final(s, k=5):
    """per-client accuracy averaged over the last k evaluated rounds (one round is noisy)"""
    rows = list(csv.DictReader(open(root / s / "clients.csv")))
    rs = sorted({int(r["round"]) for r in rows})[-k:]
    acc = {}
    for r in rows:
        if int(r["round"]) in rs:
            acc.setdefault(int(r["partition-id"]), []).append(float(r["accuracy"]))
    return {c: sum(v) / len(v) for c, v in acc.items()}
def rounds(s):
    r = list(csv.DictReader(open(root / s / "rounds.csv")))
    return [float(x["personal_mean"]) for x in r], [float(x["personal_worst10_mean"]) for x in r]
loc = final("local")
print(f"{'strategy':11s} {'BMTA@20':>8s} {'BMTA all':>8s} {'final':>7s} {'w10@20':>7s} "
      f"{'w10 fin':>7s} {'min gap (last-5 mean)':>8s} {'#<-3pt':>6s}")
for s in strategies:
    m, w = rounds(s)
    f = final(s)
    gaps = {k: 100 * (f[k] - loc[k]) for k in loc}
    worst = min(gaps, key=gaps.get)
    print(f"{s:11s} {100*max(m[:20]):8.2f} {100*max(m):8.2f} {100*m[-1]:7.2f} {100*w[19]:7.2f} "
          f"{100*w[-1]:7.2f} {gaps[worst]:+7.2f}(c{worst}) {sum(g < -3 for g in gaps.values()):6d}")
