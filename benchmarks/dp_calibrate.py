"""Noise multipliers that give a target ε, for a DP accuracy-vs-ε matrix
(benchmarks/dp-accuracy.yaml; docs/privacy.md).

Client-level: z with ε(δ = 1/clients) = target after ``rounds`` rounds of m of N clients
(:func:`flower_pfl.privacy.accountant.noise_for_epsilon`, dp-accounting).  Sample-level:
opacus' ``get_noise_multiplier`` for the SMALLEST client of the setting (the largest
sampling rate q = batch / n_i), as if it were sampled every round (``rounds`` x its steps per
round) and at δ = 1/n_min: every client's reported ε then stays <= the target.

    .venv/bin/python benchmarks/dp_calibrate.py [--matrix benchmarks/dp-accuracy.yaml]
        [--epsilons 1 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flower_pfl import config  # noqa: E402
from flower_pfl.privacy.accountant import noise_for_epsilon  # noqa: E402
from flower_pfl.privacy.fields import sampled_per_round  # noqa: E402


def client_sizes(values) -> list[int]:
    """Training examples of every client of the setting (the project's own partition)."""
    import torch

    from flower_pfl.learning.client_data import load_client_data

    return [load_client_data(values, pid, None, torch.device("cpu")).num_train
            for pid in range(int(values["clients"]))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--matrix", type=Path,
                        default=Path(__file__).resolve().parent / "dp-accuracy.yaml")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 8.0])
    args = parser.parse_args(argv)
    matrix = yaml.safe_load(args.matrix.read_text())
    values = config.validate(matrix["set"]).values
    n, m, rounds = int(values["clients"]), sampled_per_round(values), int(values["rounds"])
    print(f"client-level: N={n}, m={m}, rounds={rounds}, delta={1 / n:g}")
    for eps in args.epsilons:
        z = noise_for_epsilon(n, m, rounds, 1 / n, eps)
        print(f"  epsilon {eps:g}: noise-multiplier {z:.4f}")
    from opacus.accountants.utils import get_noise_multiplier

    sizes = client_sizes(values)
    small = min(sizes)
    batch = int(values["train.batch-size"])
    steps = rounds * (int(values["train.epochs"]) * -(-small // batch))
    print(f"sample-level: smallest client {small} examples (median {sorted(sizes)[n // 2]}), "
          f"q={min(1.0, batch / small):.4f}, {steps} steps if sampled every round, "
          f"delta={1 / small:.3g}")
    for eps in args.epsilons:
        z = get_noise_multiplier(target_epsilon=eps, target_delta=1 / small,
                                 sample_rate=min(1.0, batch / small), steps=steps)
        print(f"  epsilon {eps:g}: noise-multiplier {z:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
