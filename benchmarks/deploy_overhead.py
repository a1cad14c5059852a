"""Per-round time of real deployment (SuperLink + SuperNodes, new ClientApp process per
message) against Ray simulation, on the same small configuration, from one run each.

    .venv/bin/python benchmarks/deploy_overhead.py [--clients 3] [--rounds 4] [--set k=v ...]

Per-round time = (elapsed at the last round - elapsed at round 1) / (rounds - 1), read
from each run's rounds.csv, so start-up (Ray, SuperLink) is excluded.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

import yaml

from flower_pfl import config
from flower_pfl.running.deploy import Deployment, make_ca, make_node_key
from flower_pfl.running.launch import run_simulation


def per_round(results: Path) -> float:
    with open(results / "rounds.csv") as fh:
        rows = list(csv.DictReader(fh))
    return (float(rows[-1]["elapsed_s"]) - float(rows[0]["elapsed_s"])) / (len(rows) - 1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="deploy-overhead-"))
    tree = {"strategy": "fedamp", "rounds": args.rounds, "clients": args.clients,
            "fraction-fit": 1.0, "model": "cnn",
            "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 6000}}
    path = work / "cfg.yaml"
    path.write_text(yaml.safe_dump(tree))
    cfg = config.load(path, args.set)

    start = time.time()
    run_simulation(cfg, path, args.set, work / "sim", echo=False)
    sim_total = time.time() - start

    certs = make_ca(work / "certs")
    start = time.time()
    with Deployment(work / "dep-work", args.clients, certs) as dep:
        dep.start_superlink()
        for pid in range(args.clients):
            key, pub = make_node_key(work / "keys", f"c{pid}")
            dep.register(pub, f"c{pid}")
            dep.start_node(dep.add_node(pid, f"c{pid}", key))
        dep.run(path, args.set, work / "dep")
    dep_total = time.time() - start
    sim, dep_round = per_round(work / "sim"), per_round(work / "dep")
    print(f"{args.clients} clients, {args.rounds} rounds, CNN, fit + evaluation of all clients "
          f"every round")
    print(f"simulation : {sim:6.2f} s/round  ({sim_total:.0f} s in all)")
    print(f"deployment : {dep_round:6.2f} s/round  ({dep_total:.0f} s in all)")
    print(f"ratio deployment/simulation per round: {dep_round / sim:.1f}x")


if __name__ == "__main__":
    main()
