"""Per-round time of real deployment (SuperLink + SuperNodes, a ClientApp process per
message) against Ray simulation, on the same small configuration, with the deployment
run once per engine (``engine: stock``, Flower as released; ``engine: tuned``, its fixed
waits shortened and each ClientApp forked from a warm parent: docs/engine.md), all in one
invocation.

    .venv/bin/python benchmarks/deploy_overhead.py [--clients 3] [--rounds 4]
        [--engines stock,tuned] [--set k=v ...]

Per-round time = (elapsed at the last round - elapsed at round 1) / (rounds - 1), read
from each run's rounds.csv, so start-up (Ray, SuperLink) is excluded.  Every run has the
opt-in phase timer on (``FLOWER_PFL_PHASES``, flower_pfl/phases.py; it only wraps), and
for each deployment the table shows, per fit / evaluate step of a round (rounds 2..N):
the step as the ServerApp saw it (send, wait for every reply), the slowest ClientApp
message of that step inside its process (decode, build, train or test, encode), and the
difference -- what the step spends outside the ClientApp: Flower's waits, the
``flwr-clientapp`` process start (stock: a new interpreter importing flwr and torch;
tuned: a fork of the warm parent), the transfers.  ``--trace`` runs the deployments with
Flower's DEBUG log (a timestamp on every line of each process' log in the work folder) and
prints each step's slowest node's timeline from them (:func:`trace_steps`).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import re
import tempfile
import time
from pathlib import Path
from statistics import mean

import yaml

from flower_pfl import config, phases
from flower_pfl.running.certs import make_ca, make_node_key
from flower_pfl.running.deploy import Deployment
from flower_pfl.running.launch import run_simulation

#: the server's record kind -> the message type of its clients' records
KINDS = {"fit": "train", "evaluate": "evaluate"}


def per_round(results: Path) -> float:
    with open(results / "rounds.csv") as fh:
        rows = list(csv.DictReader(fh))
    return (float(rows[-1]["elapsed_s"]) - float(rows[0]["elapsed_s"])) / (len(rows) - 1)


def step_phases(folder: Path) -> dict[str, tuple[float, float]]:
    """kind (fit / evaluate) -> (mean step seconds at the ServerApp, mean seconds of the
    step's slowest ClientApp message), over rounds 2.. (round 1 holds the first imports)."""
    records = phases.read(folder)
    out = {}
    for kind, message in KINDS.items():
        steps, slowest = [], []
        for r in records:
            if r["role"] != "server" or r["kind"] != kind or int(r["round"] or 0) < 2:
                continue
            inside = [c["total_s"] for c in records if c["role"] == "client"
                      and c["kind"] == message and c["round"] == r["round"]]
            steps.append(r["total_s"])
            slowest.append(max(inside, default=0.0))
        out[kind] = (mean(steps) if steps else float("nan"),
                     mean(slowest) if slowest else float("nan"))
    return out


#: (label, a line of a node's DEBUG log that marks it), in the order a message passes them
MARKS = [("node has msg", "Receiving: "), ("node has objects", "Received successfully"),
         ("app has objects", "Start FAB installation"), ("app loads", "Loading ClientApp"),
         ("reply to node", "Runtime.PushMessages"), ("node sent it", "Sent successfully")]
STAMP = re.compile(r"^[A-Z]+ +(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): +(.*)$")


def trace_steps(phase_dir: Path, log_dir: Path) -> dict[str, dict[str, float]]:
    """kind -> {mark: mean seconds from the step's start (the ServerApp's) to that mark on
    the node whose reply came last, ..., "step": the step's end}, over rounds 2..; the marks
    (:data:`MARKS`) read from the nodes' DEBUG logs (Flower's timestamps, UTC)."""
    marks: dict[str, list[tuple[float, str]]] = {}
    for log in log_dir.glob("*.log"):
        if log.stem != "superlink":
            for line in log.read_text(errors="replace").splitlines():
                m = STAMP.match(line)
                label = m and next((k for k, s in MARKS if s in m.group(2)), None)
                if m and label:
                    at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
                    stamp = at.replace(tzinfo=datetime.timezone.utc).timestamp()
                    marks.setdefault(log.stem, []).append((stamp, label))
    sums: dict[str, dict[str, list[float]]] = {}
    for r in phases.read(phase_dir):
        if r["role"] != "server" or r.get("kind") not in KINDS or int(r["round"] or 0) < 2:
            continue
        start, nodes = r["end"] - r["total_s"], []
        for seen in marks.values():
            first: dict[str, float] = {}
            for at, label in seen:
                if start <= at <= r["end"] + 2:  # "Sent" may follow the step's end
                    first.setdefault(label, at - start)
            nodes.append(first)
        last = max(nodes, key=lambda n: n.get("reply to node", 0.0), default={})
        for label, _ in MARKS + [("step", "")]:
            value = r["total_s"] if label == "step" else last.get(label)
            if value is not None:
                sums.setdefault(r["kind"], {}).setdefault(label, []).append(value)
    return {kind: {k: mean(v) for k, v in got.items()} for kind, got in sums.items()}


def deployed(engine: str, path: Path, sets: list[str], work: Path, clients: int,
             certs: dict, threads: int) -> tuple[float, float, dict[str, tuple[float, float]]]:
    """One deployment run with ``engine``, ``threads`` torch threads per node (as
    ``flower-pfl deploy``: client-resources.num-cpus): (s/round, s in all,
    :func:`step_phases`)."""
    folder = work / f"phases-{engine}"
    os.environ[phases.ENV] = str(folder)  # reaches every process the Deployment starts
    start = time.time()
    with Deployment(work / f"dep-work-{engine}", clients, certs, engine=engine,
                    threads=threads) as dep:
        dep.start_superlink()
        for pid in range(clients):
            key, pub = make_node_key(work / f"keys-{engine}", f"c{pid}")
            dep.register(pub, f"c{pid}")
            dep.start_node(dep.add_node(pid, f"c{pid}", key))
        dep.run(path, [*sets, f"engine={engine}"], work / f"dep-{engine}")
    total = time.time() - start
    return per_round(work / f"dep-{engine}"), total, step_phases(folder)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--engines", default="stock,tuned",
                   help="the deployments to run, in order (default: stock,tuned)")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--trace", action="store_true",
                   help="Flower's DEBUG log in every process; print each step's timeline")
    args = p.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - set(config.ENGINES):
        p.error(f"--engines: a comma-separated list of {list(config.ENGINES)}")
    work = Path(tempfile.mkdtemp(prefix="deploy-overhead-"))
    tree = {"strategy": "fedamp", "rounds": args.rounds, "clients": args.clients,
            "fraction-fit": 1.0, "model": "cnn",
            "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 6000}}
    path = work / "cfg.yaml"
    path.write_text(yaml.safe_dump(tree))
    cfg = config.load(path, args.set)

    os.environ[phases.ENV] = str(work / "phases-sim")
    start = time.time()
    run_simulation(cfg, path, args.set, work / "sim", echo=False)
    sim_total = time.time() - start
    sim = per_round(work / "sim")

    certs = make_ca(work / "certs")
    if args.trace:
        os.environ["FLWR_LOG_LEVEL"] = "DEBUG"  # timestamped lines in every process' log
    runs = {e: deployed(e, path, args.set, work, args.clients, certs,
                        cfg["client-resources.num-cpus"]) for e in engines}
    print(f"{args.clients} clients, {args.rounds} rounds, CNN, FedAMP, fit + evaluation of "
          f"all clients every round, TLS on 127.0.0.1 (work folder {work})")
    print(f"simulation          : {sim:6.2f} s/round  ({sim_total:.0f} s in all)")
    for engine, (dep_round, total, _) in runs.items():
        print(f"deployment, {engine:6}  : {dep_round:6.2f} s/round  ({total:.0f} s in all)  "
              f"{dep_round / sim:5.1f}x simulation")
    print("\nper step, rounds 2..N (s): the step at the ServerApp | its slowest ClientApp "
          "message inside its process | outside the ClientApp (waits, process start, "
          "transfers)")
    for engine, (_, _, steps) in runs.items():
        for kind, (step, inside) in steps.items():
            print(f"  {engine:6} {kind:8}: {step:6.2f} | {inside:6.2f} | {step - inside:6.2f}")
    for engine in runs if args.trace else ():
        print(f"\n{engine}: the step's last reply, s from the step's start (rounds 2..N)")
        for kind, marks in trace_steps(work / f"phases-{engine}",
                                       work / f"dep-work-{engine}").items():
            print(f"  {kind:8}: " + "  ".join(f"{k} {v:5.2f}" for k, v in marks.items()))
    if {"stock", "tuned"} <= set(runs):
        print(f"\ntuned / stock per round: {runs['tuned'][0] / runs['stock'][0]:.2f}")


if __name__ == "__main__":
    main()
