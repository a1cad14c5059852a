"""Self-FL on the two-level Gaussian task vs the closed form theta_m^(FL) of eq. 3.

For each M prints the ratio

    mean_m |theta_m^T - theta_m^FL|  /  mean_m |z_m - theta_m^FL|

(0: Self-FL reaches the Bayesian posterior mean; 1: no better than the local estimate z_m)
for the oracle variances (true sigma_0^2, sigma_m^2), the bootstrap estimator (default,
eqs. 13-14 over bootstrapped local optima), the surrogate estimator (eqs. 13-14 over the
personal models) and "global only" (every client uses the global optimum theta^(G) of
eq. 2 with the true variances -- the best any non-personalized model can do), plus the
sigma_0^2 each estimator ends at (the true value is data.synthetic-sigma0-sq) and the
median over clients of sigma_m^2 / (noise^2 / N_m), and CPU seconds per round.

    .venv/bin/python benchmarks/selffl_synthetic.py [--clients 20 50 200] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

from flower_pfl import config, data, inprocess
from flower_pfl import selffl_math as sm

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "selffl-synthetic.yaml"
VARIANTS = {"oracle": ["hyper.selffl.oracle=true"],
            "bootstrap": ["hyper.selffl.variance-estimator=bootstrap"],
            "surrogate": ["hyper.selffl.variance-estimator=surrogate"]}


def personal_thetas(strategy, m: int) -> np.ndarray:
    return np.array([float(strategy.proxies[p].context.state["personal"].to_numpy_ndarrays()[0][0])
                     for p in range(m)])


def run_variant(cfg, out: Path) -> dict:
    """Ratio to theta^FL, final sigma_0^2, median sigma_m^2 / truth, CPU s per round."""
    started = time.process_time()
    s = inprocess.run(cfg, out)
    cpu = (time.process_time() - started) / cfg["rounds"]
    truth = data.gaussian_truth(cfg.values)
    target = sm.theta_fl(truth.z_mean, truth.sigma0_sq, truth.sigma_sq)
    gap = np.mean(np.abs(truth.z_mean - target))
    sigma_sq = np.array([s.store.get("sigma_sq", p, np.nan) for p in range(cfg["clients"])])
    return {"ratio": float(np.mean(np.abs(personal_thetas(s, cfg["clients"]) - target)) / gap),
            "sigma0_sq": float(s.sigma0_sq), "cpu_s": cpu,
            "sigma_m": float(np.median(sigma_sq / truth.sigma_sq))}


def global_only_ratio(cfg) -> float:
    truth = data.gaussian_truth(cfg.values)
    target = sm.theta_fl(truth.z_mean, truth.sigma0_sq, truth.sigma_sq)
    g = sm.theta_global(truth.z_mean, truth.sigma0_sq, truth.sigma_sq)
    return float(np.mean(np.abs(g - target)) / np.mean(np.abs(truth.z_mean - target)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, nargs="+", default=[20, 50, 200])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    out = Path(tempfile.mkdtemp(prefix="selffl-"))
    print(f"{'M':>5} {'variances':>10} {'ratio':>8} {'global-only':>11} {'sigma0^2 end':>12} "
          f"{'sigma_m^2/true':>14} {'cpu s/round':>11}")
    for m in args.clients:
        for name in args.variants:
            cfg = config.load(CONFIG, [f"clients={m}", *VARIANTS[name], *args.set])
            r = run_variant(cfg, out / f"{m}-{name}")
            print(f"{m:>5} {name:>10} {r['ratio']:8.4f} {global_only_ratio(cfg):11.4f} "
                  f"{r['sigma0_sq']:12.5f} {r['sigma_m']:14.3f} {r['cpu_s']:11.3f}", flush=True)


if __name__ == "__main__":
    main()
