"""Per-round cost of differential privacy on the DNN (issue 52's acceptance: client-level
<= 1.05x and sample-level (opacus DP-SGD) <= 2x the same run without DP).

Three federations of the same setting run in this process (flower_pfl/running/inprocess.py,
each message through a simulation's round trip, no Ray): ``none``, ``client-level``
(clip + server noise + accountant) and ``sample-level`` (DP-SGD in every client), each for
``--rounds`` rounds, in an order rotated every repeat.  A round's time is the difference of
consecutive ``elapsed_s`` in rounds.csv (evaluation every round, the same work for all three);
the first round (start-up) is left out.  Printed: median seconds per round of each variant
and the ratios to ``none`` (of the medians, and the median of the paired per-repeat ratios).

Where the time goes (cProfile, issue 52): client-level's ε curve (dp-accounting, ~0.2 s) is
computed once per run (privacy/accountant.py ``event_rdp``), clipping and noise are ~12 ms a
round; sample-level's per-step cost is opacus' ghost clipping (two backward passes, no
per-sample gradients) plus the Gaussian noise on every parameter each step (~0.5 ms for the
DNN's 159k, irreducible), and each client's first fit in the process computes its opacus RDP
curve once (~0.1 s, privacy/sample_level.py ``step_rdp``) -- rounds where many clients are
new cost more, so use enough rounds (>= 6) that the median is a steady round.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dp_cost.py [--repeats 9] [--rounds 6]
        [--clients 20] [--subsample 20000]

Nine repeats by default: on a machine whose rounds spread by 20-50% between runs, three
repeats do not separate a 5% cost from that spread (docs/BENCHMARKS.md (i)).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flower_pfl import config  # noqa: E402
from flower_pfl.running.inprocess import run  # noqa: E402

VARIANTS = {
    "none": {},
    "client-level": {"privacy": {"mode": "client-level", "clip-norm": 1.0,
                                 "noise-multiplier": 1.0}},
    "sample-level": {"privacy": {"mode": "sample-level", "max-grad-norm": 1.0,
                                 "noise-multiplier": 1.0}},
}


def seconds_per_round(results: Path) -> float:
    with open(results / "rounds.csv", newline="") as fh:
        elapsed = [float(r["elapsed_s"]) for r in csv.DictReader(fh)]
    return statistics.median(b - a for a, b in zip(elapsed, elapsed[1:]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--subsample", type=int, default=20000)
    args = parser.parse_args(argv)
    base = {"strategy": "fedavg", "rounds": args.rounds, "clients": args.clients,
            "fraction-fit": 0.5, "eval-every": 1, "model": "dnn", "checkpoint-every": 0,
            "data": {"dataset": "fmnist", "partition": "dirichlet", "alpha": 0.3,
                     "subsample": args.subsample},
            "train": {"epochs": 1, "batch-size": 32, "lr": 0.05}}
    names = list(VARIANTS)
    times: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="dp-cost-") as tmp:
        for rep in range(args.repeats):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                cfg = config.validate(config.merge(base, VARIANTS[name]), source=name)
                out = Path(tmp) / f"{name}-{rep}"
                run(cfg, out)
                times[name].append(seconds_per_round(out))
                print(f"repeat {rep} {name}: {times[name][-1]:.3f} s/round", flush=True)
    ref = statistics.median(times["none"])
    for name in names:
        med = statistics.median(times[name])
        paired = statistics.median(t / r for t, r in zip(times[name], times["none"]))
        print(f"{name:13s} median {med:.3f} s/round  ratio {med / ref:.3f}  "
              f"paired ratio {paired:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
