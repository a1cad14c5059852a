"""Where a client message's and a server round's time goes (docs/BENCHMARKS.md (a)).

Runs ``flower-pfl run`` (``sim_memory.run_arm``) on round_limit.py's workload with the
opt-in phase timer on (``FLOWER_PFL_PHASES``, flower_pfl/phases.py; the wrapped functions
are listed in flower_pfl/timing.py) and prints, over rounds 2..N-1 (round 1 pays the imports
and the data cache, round N the run's end: curves.png, summary):

* per client message (train and evaluate): the mean milliseconds of each phase and its
  share of the time inside the ClientApp;
* outside the ClientApp, per message: the two actors' time in those rounds (2 x the
  server's fit + evaluate wall time) minus the time spent inside the ClientApp, over the
  messages -- Flower's and Ray's transport (the Message and Context to and from the actor,
  the simulation engine's queues) and the actors' idle time while the server polls;
* per server round: each phase's milliseconds;
* round 1: each actor's first message beside a later one (what the first pays: the data
  cache, the partition, the model build), and what importing the ClientApp module costs a
  fresh interpreter, by package (``python -X importtime``; an actor pays it before its
  first message): ours (flower_pfl, clients, strategies) apart from torch's and Flower's.

    .venv/bin/python benchmarks/message_phases.py --rounds 5 [--strategy fedamp] [--tree DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from round_limit import LR  # noqa: E402 - benchmarks/
from sim_memory import idle_baseline, run_arm  # noqa: E402
from sim_overhead import workload  # noqa: E402

from flower_pfl import phases  # noqa: E402


def print_table(title: str, records: list[dict], unit_total: float | None = None) -> float:
    n, total, rows = phases.table(records)
    print(f"\n{title}: {n} records, {1000 * total:.2f} ms each")
    print(f"   {'phase':<58}{'ms':>8}{'share':>8}")
    for name, seconds, share in rows:
        print(f"   {name:<58}{1000 * seconds:>8.2f}{100 * share:>7.1f}%")
    return total


def back_to_back_gaps(client: list[dict]) -> list[float]:
    """Per actor, the time from one message's end to the next one's start, for messages of
    the same step (round and kind) only: the step boundaries are the server's waits."""
    gaps = []
    by_actor: dict[int, list[dict]] = {}
    for r in client:
        if "end" in r:  # (records of an older timer have no end time)
            by_actor.setdefault(r["pid"], []).append(r)
    for rows in by_actor.values():
        rows.sort(key=lambda r: r["end"])
        for a, b in zip(rows, rows[1:]):
            if (a["round"], a["kind"]) == (b["round"], b["kind"]):
                gaps.append(b["end"] - b["total_s"] - a["end"])
    return gaps


def first_messages(client: list[dict]) -> list[dict]:
    """Each actor's (pid's) first message of the run."""
    first: dict[int, dict] = {}
    for r in client:
        if "end" not in r:
            continue
        start = r["end"] - r["total_s"]
        if r["pid"] not in first or start < first[r["pid"]]["end"] - first[r["pid"]]["total_s"]:
            first[r["pid"]] = r
    return list(first.values())


#: the packages whose own import time is ours
OURS = ("flower_pfl", "clients", "strategies")


def import_seconds(stderr: str) -> dict[str, float]:
    """``python -X importtime`` output summed by top-level package (each module's *self*
    time, so that nothing counts twice): {package: seconds}."""
    out: dict[str, float] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = (part.strip() for part in line[len("import time:"):].split("|"))
        top = name.split(".")[0]
        out[top] = out.get(top, 0.0) + int(self_us) / 1e6
    return out


def client_app_imports(tree: Path) -> dict[str, float]:
    """Import the ClientApp module in a fresh interpreter (``tree`` first on its path, one
    BLAS thread as an actor has) and return :func:`import_seconds`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "import flower_pfl.client_app"], capture_output=True, text=True,
                          env=env, cwd=tree, check=True)
    return import_seconds(done.stderr)


def print_imports(seconds: dict[str, float]) -> None:
    total = sum(seconds.values())
    ours = sum(v for k, v in seconds.items() if k in OURS)
    named = {"ours (" + ", ".join(OURS) + ")": ours, "torch": seconds.get("torch", 0.0),
             "flwr": seconds.get("flwr", 0.0)}
    named["everything else (numpy, grpc, ray, stdlib, ...)"] = total - sum(named.values())
    print(f"\nimporting flower_pfl.client_app in a fresh interpreter: {total:.2f} s")
    for name, value in named.items():
        print(f"   {name:<58}{value:>8.2f}{100 * value / total:>7.1f}%")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--subsample", type=int, default=None)
    p.add_argument("--strategy", default="fedavg")
    p.add_argument("--actors", type=int, default=2, help="ClientApp actors (num-cpus 1 each)")
    p.add_argument("--tree", default=str(ROOT), help="the project copy to run")
    p.add_argument("--keep", default=None, help="keep the phase records in this folder")
    p.add_argument("--records", default=None,
                   help="print the tables of records kept by an earlier --keep; run nothing")
    args = p.parse_args()
    if args.records:
        report(phases.read(Path(args.records)), args.rounds, args.actors)
        return
    print(f"load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="message-phases-") as tmp:
        out = Path(args.keep or Path(tmp) / "phases")
        out.mkdir(parents=True, exist_ok=True)
        os.environ[phases.ENV] = str(out)
        tree = dict(workload(args.rounds, args.subsample, Path(tmp), lr=LR),
                    strategy=args.strategy)
        res = run_arm(args.strategy, tree, Path(tmp), idle_baseline(2.0), 0.5, 900.0,
                      Path(args.tree))
        records = phases.read(out)
    imports = client_app_imports(Path(args.tree))  # after the run: it has the cores alone
    print(f"\n{args.strategy}: {res['s_per_round']:.3f} s/round (timer on), wall {res['wall_s']} s")
    report(records, args.rounds, args.actors)
    print_imports(imports)
    print(f"\nload average after: {os.getloadavg()}")


def report(records: list[dict], rounds: int, actors: int) -> None:
    every = [r for r in records if r["role"] == "client" and r["kind"] in ("train", "evaluate")]
    # rounds 2..N-1: round 1 pays the imports and caches, round N the run's end (figures)
    records = [r for r in records if 2 <= int(r.get("round") or 0) < rounds]
    client = [r for r in records if r["role"] == "client" and r["kind"] in ("train", "evaluate")]
    server = [r for r in records if r["role"] == "server"]
    inside = print_table("client message (train + evaluate), inside the ClientApp", client)
    for kind in ("train", "evaluate"):
        print_table(f"client message ({kind})", [r for r in client if r["kind"] == kind])
    seen = {r["round"] for r in server}
    server_s = sum(r["total_s"] for r in server) / max(len(seen), 1)
    per_round_msgs = len(client) / max(len(seen), 1)
    outside = (actors * server_s - per_round_msgs * inside) / max(per_round_msgs, 1)
    print(f"\nper message outside the ClientApp (Flower/Ray transport, actors idle while the "
          f"server polls): {actors} actors x {server_s:.3f} s server fit+evaluate per "
          f"round - {per_round_msgs:.0f} messages x {1000 * inside:.2f} ms = "
          f"{1000 * outside:.2f} ms per message")
    gaps = back_to_back_gaps(client)
    if gaps:
        print(f"of which between back-to-back messages of one actor within a step (Flower's "
              f"and Ray's transport of the Message and Context, the engine's worker loop): "
              f"median {1000 * statistics.median(gaps):.2f} ms, mean "
              f"{1000 * statistics.mean(gaps):.2f} ms over {len(gaps)} gaps")
    print_table("server, per fit step", [r for r in server if r["kind"] == "fit"])
    print_table("server, per evaluate step", [r for r in server if r["kind"] == "evaluate"])
    first = first_messages(every)
    print_table("round 1: each actor's first message (data cache, partition, model build)",
                first)
    print_table("for comparison: the same kind of message in rounds 2..N-1",
                [r for r in client if r["kind"] in {f["kind"] for f in first}])


if __name__ == "__main__":
    main()
