"""Self-FL on the two-level Gaussian task vs the closed form theta_m^(FL) of eq. 3.

Prints, for each M and for the oracle (true sigma_0^2, sigma_m^2) and the estimated
variances (eqs. 13-14), the ratio

    mean_m |theta_m^T - theta_m^FL|  /  mean_m |z_m - theta_m^FL|

(0: Self-FL reaches the Bayesian posterior mean; 1: no better than the local estimate).

    .venv/bin/python benchmarks/selffl_synthetic.py [--clients 20 200] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import numpy as np

from flower_pfl import config, data, inprocess
from flower_pfl import selffl_math as sm

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "selffl-synthetic.yaml"


def closeness(cfg, out: Path) -> tuple[float, float]:
    s = inprocess.run(cfg, out)
    truth = data.gaussian_truth(cfg.values)
    target = sm.theta_fl(truth.z_mean, truth.sigma0_sq, truth.sigma_sq)
    theta = np.array([float(s.proxies[p].context.state["personal"].to_numpy_ndarrays()[0][0])
                      for p in range(cfg["clients"])])
    ratio = np.mean(np.abs(theta - target)) / np.mean(np.abs(truth.z_mean - target))
    return float(ratio), float(s.sigma0_sq)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, nargs="+", default=[20, 200])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    out = Path(tempfile.mkdtemp(prefix="selffl-"))
    print(f"{'M':>5} {'variances':>10} {'ratio':>8} {'sigma0^2 used':>14}")
    for m in args.clients:
        for oracle in (True, False):
            cfg = config.load(CONFIG, [f"clients={m}", f"hyper.selffl.oracle={str(oracle).lower()}",
                                       *args.set])
            ratio, s0 = closeness(cfg, out / f"{m}-{oracle}")
            print(f"{m:>5} {'oracle' if oracle else 'estimated':>10} {ratio:8.4f} {s0:14.6f}",
                  flush=True)


if __name__ == "__main__":
    main()
