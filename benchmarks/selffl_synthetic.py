"""Self-FL on the two-level Gaussian task vs the closed form theta_m^(FL) of eq. 3.

For each M prints the ratio

    mean_m |theta_m^T - theta_m^FL|  /  mean_m |z_m - theta_m^FL|

(0: Self-FL reaches the Bayesian posterior mean; 1: no better than the local estimate z_m)
for the oracle variances (true sigma_0^2, sigma_m^2), the bootstrap estimator (default,
eqs. 13-14 over bootstrapped local optima), the surrogate estimator (eqs. 13-14 over the
personal models) and "global only" (every client uses the global optimum theta^(G) of
eq. 2 with the true variances -- the best any non-personalized model can do) and
"plug-in" (eq. 3 with sigma_m^2 = s_m^2/N_m and sigma_0^2 = var(z_m): what exact
estimates from the clients' own data give, a floor for any estimator), plus the
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

from flower_pfl import config
from flower_pfl.algorithms import selffl_math as sm
from flower_pfl.learning import data
from flower_pfl.running import inprocess

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


def reference_ratios(cfg) -> tuple[float, float]:
    """(global only, plug-in): the ratio of theta^(G) (true variances) for every client,
    and of eq. 3 evaluated with the best estimates a client's data allow -- sigma_m^2 =
    s_m^2 / N_m (sample variance) and sigma_0^2 = var(z_m) -- a floor for any estimator."""
    truth = data.gaussian_truth(cfg.values)
    target = sm.theta_fl(truth.z_mean, truth.sigma0_sq, truth.sigma_sq)
    gap = np.mean(np.abs(truth.z_mean - target))
    g = sm.theta_global(truth.z_mean, truth.sigma0_sq, truth.sigma_sq)
    s_sq = np.array([z.var(ddof=1) / len(z) for z in truth.z])
    plug = sm.theta_fl(truth.z_mean, float(truth.z_mean.var(ddof=1)), s_sq)
    return (float(np.mean(np.abs(g - target)) / gap),
            float(np.mean(np.abs(plug - target)) / gap))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, nargs="+", default=[20, 50, 200])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    out = Path(tempfile.mkdtemp(prefix="selffl-"))
    print(f"{'M':>5} {'variances':>10} {'ratio':>8} {'global-only':>11} {'plug-in':>8} "
          f"{'sigma0^2 end':>12} {'sigma_m^2/true':>14} {'cpu s/round':>11}")
    for m in args.clients:
        for name in args.variants:
            cfg = config.load(CONFIG, [f"clients={m}", *VARIANTS[name], *args.set])
            r = run_variant(cfg, out / f"{m}-{name}")
            glob, plug = reference_ratios(cfg)
            print(f"{m:>5} {name:>10} {r['ratio']:8.4f} {glob:11.4f} {plug:8.4f} "
                  f"{r['sigma0_sq']:12.5f} {r['sigma_m']:14.3f} {r['cpu_s']:11.3f}", flush=True)


if __name__ == "__main__":
    main()
