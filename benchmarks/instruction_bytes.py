"""Bytes of one round's instructions (the ConfigRecord of every fit and evaluate message) at
N clients, with the run's configuration in every message (``cfg_travels``, a ServerApp
started by ``flwr run`` with a YAML path) and in the run config only (``flower-pfl run``,
``submit``, ``bench``: the clients read ``context.run_config["cfg"]``).  The model's
arrays are the same either way and not counted.  docs/BENCHMARKS.md, "Instructions".

    .venv/bin/python benchmarks/instruction_bytes.py --clients 1000 --strategies fedavg fedamp
"""

from __future__ import annotations

import argparse
import tempfile

from flwr.app import ConfigRecord

from flower_pfl import config, registry
from flower_pfl.running import inprocess


def round_bytes(strategy_name: str, clients: int, travels: bool) -> tuple[int, int, int]:
    """(fit messages, evaluate messages, bytes of their ConfigRecords) of round 1."""
    cfg = config.validate({"strategy": strategy_name, "clients": clients, "fraction-fit": 0.1,
                           "rounds": 1, "model": "mclr", "eval-every": 1,
                           "checkpoint-every": 0,
                           "data": {"dataset": "fmnist", "subsample": 20 * clients}})
    manager = inprocess.make_federation(clients,
                                        run_config={} if travels else {"cfg": cfg.to_json()})
    with tempfile.TemporaryDirectory() as out:
        strategy = registry.strategy_class(cfg.strategy)(cfg, results_dir=out)
        strategy.cfg_travels = travels
        parameters = strategy.initialize_parameters(manager)
        fit = strategy.configure_fit(1, parameters, manager)
        ev = strategy.configure_evaluate(1, parameters, manager)
        size = sum(len(ConfigRecord(dict(ins.config)).deflate()) for _, ins in [*fit, *ev])
    return len(fit), len(ev), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--strategies", nargs="+", default=["fedavg", "fedamp"])
    args = ap.parse_args()
    print("| strategy | clients | fit + evaluate messages | config in every message | "
          "config in the run config | ratio |")
    print("|---|---|---|---|---|---|")
    for name in args.strategies:
        n_fit, n_ev, before = round_bytes(name, args.clients, True)
        _, _, after = round_bytes(name, args.clients, False)
        print(f"| {name} | {args.clients} | {n_fit} + {n_ev} | {before:,} B | {after:,} B | "
              f"{after / before:.3f} |")


if __name__ == "__main__":
    main()
