"""How sharp is FedAMP's attention for each sigma-scale?  (docs/algorithms/fedamp.md, run S)

Runs FedAMP in-process for a few rounds, then recomputes eq. 5/7 weights of the stored
models (``alpha-k: auto``) for several ``sigma = scale * median squared distance`` and
prints the share of the peer weight that lands on related clients (same group on the
practical partition, at least one shared class on the pathological one), the mean/min
weight on peers (1 - xi_ii) and the peak/mean peer weight.  The old rule (sigma = median,
alpha_k = sigma/n) is printed last.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedamp_sigma.py --set strategy=fedamp \
        --set rounds=5 --set clients=50 --set fraction-fit=1.0 \
        --set data.partition=pathological --set data.subsample=10000
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import numpy as np

from flower_pfl import config
from flower_pfl.algorithms.attention import (
    fedamp_auto_weights,
    fedamp_weights,
    offdiag_mass,
    peak_over_mean,
)
from flower_pfl.learning.client_data import load_client_data
from flower_pfl.learning.partitions import group_of_clients
from flower_pfl.running import inprocess


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default=str(Path(__file__).resolve().parent.parent /
                                           "simulation.yaml"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--scales", nargs="+", type=float,
                   default=[1.0, 0.5, 0.3, 0.2, 0.1, 0.05, 0.02])
    p.add_argument("--min-self-weight", type=float, default=0.5)
    args = p.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    out = Path(tempfile.mkdtemp(prefix="fedamp-sigma-"))
    cfg = config.load(args.config, [*args.set, "output-dir=" + str(out)])
    s = inprocess.run(cfg, out)
    n = cfg["clients"]
    if cfg["data.partition"] == "practical":
        g = group_of_clients(n, cfg["data.groups"])
        related, label = g[:, None] == g[None, :], "same group"
    else:
        cls = [set(np.unique(load_client_data(cfg.values, c, None).y_train.numpy()).tolist())
               for c in range(n)]
        related = np.array([[bool(cls[i] & cls[j]) for j in range(n)] for i in range(n)])
        label = "shares a class"
    np.fill_diagonal(related, False)
    rows, peers = np.arange(n), s.matrix.seen.copy()
    d = s.matrix.sq_distances(rows)
    med = float(np.median(d[~np.eye(n, dtype=bool)]))

    def share(xi):
        off = xi.copy()
        np.fill_diagonal(off, 0.0)
        return (off * related).sum() / off.sum()

    print(f"median squared distance {med:.4g}; uniform share on '{label}' peers "
          f"{related.sum() / (n * (n - 1)):.3f}")
    for scale in args.scales:
        xi, _ = fedamp_auto_weights(d, rows, peers, scale * med, args.min_self_weight)
        mass = offdiag_mass(xi, rows)
        print(f"sigma-scale {scale:5.2f}: share {share(xi):.3f}  peer mass mean {mass.mean():.3f} "
              f"min {mass.min():.3g}  peak/mean {peak_over_mean(xi, rows):.1f}")
    xi = fedamp_weights(d, rows, peers, med / n, med)  # old code: sigma / n_seen
    print(f"old rule (sigma = median, alpha_k = sigma/n): share {share(xi):.3f}  self weight "
          f"mean {xi.diagonal().mean():.3f}  peak/mean {peak_over_mean(xi, rows):.2f}")


if __name__ == "__main__":
    main()
