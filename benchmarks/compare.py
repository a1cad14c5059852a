"""Compare strategies on one configuration, in one process (same data, same seed).

Runs each strategy with its real Strategy and NumPyClient classes through
flower_pfl.running.inprocess (no Ray: fast for small studies) and prints final and best
(BMTA) personalized accuracy, worst-10% accuracy and the global accuracy where there is
one.  For experiments of record use `flower-pfl run` (Flower's simulation engine).

    .venv/bin/python benchmarks/compare.py --config simulation.yaml \
        --strategies local fedavg-ft fedamp heurfedamp fedacs --set rounds=20
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

from flower_pfl import config
from flower_pfl.running import inprocess


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default=str(Path(__file__).resolve().parent.parent /
                                           "simulation.yaml"))
    p.add_argument("--strategies", nargs="+", required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default=None, help="results folder (default: a temp dir)")
    args = p.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    out = Path(args.out or tempfile.mkdtemp(prefix="compare-"))
    print(f"config {args.config} {' '.join(args.set)}  (results in {out})")
    print(f"{'strategy':12s} {'final':>7s} {'BMTA':>7s} {'worst10%':>9s} {'global':>7s}"
          f" {'time_s':>7s}")
    for name in args.strategies:
        cfg = config.load(args.config, [*args.set, f"strategy={name}", "output-dir=" + str(out)])
        start = time.time()
        s = inprocess.run(cfg, out / name)
        last = s.results.rounds[-1]
        glob = last.get("global_mean")
        print(f"{name:12s} {last['personal_mean']:7.4f}"
              f" {max(h['mean'] for h in s.eval_history):7.4f}"
              f" {last['personal_worst10_mean']:9.4f}"
              f" {glob if glob is None else round(glob, 4)!s:>7s}"
              f" {time.time() - start:7.1f}", flush=True)


if __name__ == "__main__":
    main()
