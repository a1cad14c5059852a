"""Cost of a prox-term client round vs FedAvg's: the autograd term vs the fused update.

Issue 29's workload: FMNIST DNN, pathological 2 classes per client, 20 clients all sampled,
batch 10, 1 local epoch.  The script runs the real strategies and clients in ONE process
(flower_pfl/running/inprocess.py: each message goes through the round trip of a simulation,
without Ray) and times a round two ways: the fit phase (every client's local training plus
the server's aggregation -- FedAMP's attention included) and the whole round (fit phase
plus every client's evaluation, as in a simulation round; the evaluation does the same work
for every method, so it only dilutes the ratio).

Variants, each its own federation (own client states), one round each per repeat, in an
order rotated every repeat (paired, interleaved: machine noise hits every variant alike):

- ``fedavg``: the reference.
- ``<strategy>/autograd``: the prox term added to the loss and differentiated by autograd
  (the path before issue 29; reachable only from here: :func:`autograd_train` routes a
  ``prox.Prox`` back through ``prox_penalty``).
- ``<strategy>/fused``: the shipped path (``prox.add_prox_grad_``).

The autograd and fused federations start from the same model and seed, so they must agree
bit for bit every round (checked and printed: a cheap end-to-end test of the fused path).
Printed: seconds (min and median over the repeats) and the ratios to FedAvg, before
(autograd) and after (fused): of the mins, of the medians, and the median of the paired
per-repeat ratios.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prox_cost.py [--repeats 5]
        [--strategies fedamp fedprox] [--subsample N] [--clients 20] [--batch-size 10]

``--phases``: instead, milliseconds per client message by phase (issue 42's workload, lr
0.005) for ``--strategies`` (default here fedavg fedprox fedamp), each its own in-process
federation, rounds interleaved; min over the rounds after the first.  The phases are
wall-clock wrappers around the functions named (nested: ``train()`` contains backward,
opt.step and prox grad; ``fit message`` contains the client's ``fit()``).  The tree timed
is the ``flower_pfl`` first on the path: before/after by PYTHONPATH, e.g.

    PYTHONPATH=/path/to/old/tree .venv/bin/python benchmarks/prox_cost.py --phases
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time

import torch

import flower_pfl.clients.base
from flower_pfl import config, registry
from flower_pfl.algorithms.prox import Prox, prox_penalty
from flower_pfl.learning.training import train
from flower_pfl.running import inprocess


def autograd_train(model, *args, regularizer=None, **kwargs):
    """``training.train`` as before issue 29: a Prox is added to the loss (autograd)."""
    if isinstance(regularizer, Prox):
        prox = regularizer
        regularizer = lambda m: prox_penalty(m, prox.center, prox.coef)  # noqa: E731
    return train(model, *args, regularizer=regularizer, **kwargs)


@contextlib.contextmanager
def old_path(on: bool):
    """Route the clients' local training through :func:`autograd_train` while ``on``."""
    if not on:
        yield
        return
    flower_pfl.clients.base.train = autograd_train
    try:
        yield
    finally:
        flower_pfl.clients.base.train = train


class Federation:
    """One strategy with its own in-process clients; ``round()`` runs one fit phase."""

    def __init__(self, cfg, results_dir: str, autograd: bool = False) -> None:
        self.cfg, self.autograd = cfg, autograd
        self.manager = inprocess.make_federation(cfg["clients"])
        self.strategy = registry.strategy_class(cfg.strategy)(cfg, results_dir=results_dir)
        self.parameters = self.strategy.initialize_parameters(self.manager)
        self.rounds, self.seconds, self.round_seconds = 0, [], []

    def round(self) -> None:
        self.rounds += 1
        with old_path(self.autograd):
            start = time.perf_counter()
            fit_ins = self.strategy.configure_fit(self.rounds, self.parameters, self.manager)
            results = [(proxy, proxy.fit(ins, None, None)) for proxy, ins in fit_ins]
            new, _ = self.strategy.aggregate_fit(self.rounds, results, [])
            fitted = time.perf_counter()
            self.parameters = new if new is not None else self.parameters
            eval_ins = self.strategy.configure_evaluate(self.rounds, self.parameters,
                                                        self.manager)
            evals = [(proxy, proxy.evaluate(ins, None, None)) for proxy, ins in eval_ins]
            self.strategy.aggregate_evaluate(self.rounds, evals, [])
            done = time.perf_counter()
        self.seconds.append(fitted - start)
        self.round_seconds.append(done - start)
        self.uploads = {int(r.metrics["partition-id"]): r.parameters.tensors for _, r in results}
        self.steps = sum(float(r.metrics["local_steps"]) for _, r in results)


def make_cfg(strategy: str, args, lr: float = 0.01) -> config.RunConfig:
    data = {"dataset": "fmnist", "partition": "pathological", "classes-per-client": 2}
    if args.subsample:
        data["subsample"] = args.subsample
    return config.validate({
        "strategy": strategy, "clients": args.clients, "fraction-fit": 1.0, "model": "dnn",
        "rounds": args.repeats + 1, "device": "cpu", "seed": 0, "data": data,
        "train": {"epochs": 1, "batch-size": args.batch_size, "lr": lr}},
        source="prox_cost")


def summary(values: list[float]) -> tuple[float, float]:
    return min(values), statistics.median(values)


PHASES = ("setup", "new_model", "regularizer (center)", "backward", "opt.step", "prox grad",
          "train()", "save_personal", "client fit()", "fit message", "evaluate()",
          "client evaluate()", "evaluate message", "server aggregate_fit", "round")


def phases(args) -> None:
    """ms per client message by phase (see the module docstring, ``--phases``)."""
    import collections
    import functools
    import logging

    import flower_pfl.learning.training as training
    from flower_pfl.clients import base, fedamp, fedprox

    logging.getLogger("flwr").setLevel(logging.WARNING)
    spent: dict[str, float] = collections.defaultdict(float)

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - start
        return wrapper

    training.add_prox_grad_ = timed("prox grad", training.add_prox_grad_)
    torch.optim.SGD.step = timed("opt.step", torch.optim.SGD.step)
    torch.Tensor.backward = timed("backward", torch.Tensor.backward)
    base.train = timed("train()", base.train)
    base.evaluate = timed("evaluate()", base.evaluate)
    for meth in ("new_model", "save_personal", "setup"):
        setattr(base.PFLClient, meth, timed(meth, getattr(base.PFLClient, meth)))
    for cls in (fedprox.FedProxClient, fedamp.FedAMPClient):
        cls.regularizer = timed("regularizer (center)", cls.regularizer)
    base.PFLClient.fit = timed("client fit()", base.PFLClient.fit)
    base.PFLClient.evaluate = timed("client evaluate()", base.PFLClient.evaluate)
    proxy = inprocess.InProcessProxy
    proxy.fit = timed("fit message", proxy.fit)
    proxy.evaluate = timed("evaluate message", proxy.evaluate)
    names = args.strategies if args.strategies != ["fedamp", "fedprox"] else \
        ["fedavg", "fedprox", "fedamp"]
    rows: dict[str, dict[str, list[float]]] = {n: collections.defaultdict(list) for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        feds = {}
        for name in names:
            cfg = make_cfg(name, args, lr=0.005)
            manager = inprocess.make_federation(cfg["clients"])
            strategy = registry.strategy_class(name)(cfg, results_dir=f"{tmp}/{name}")
            feds[name] = [manager, strategy, strategy.initialize_parameters(manager)]
        for rnd in range(1, args.repeats + 2):
            for name in names:
                manager, strategy, params = feds[name]
                spent.clear()
                t0 = time.perf_counter()
                fit_ins = strategy.configure_fit(rnd, params, manager)
                results = [(px, px.fit(ins, None, None)) for px, ins in fit_ins]
                t1 = time.perf_counter()
                new, _ = strategy.aggregate_fit(rnd, results, [])
                spent["server aggregate_fit"] += time.perf_counter() - t1
                feds[name][2] = params = new if new is not None else params
                eval_ins = strategy.configure_evaluate(rnd, params, manager)
                evals = [(px, px.evaluate(ins, None, None)) for px, ins in eval_ins]
                strategy.aggregate_evaluate(rnd, evals, [])
                spent["round"] += time.perf_counter() - t0
                if rnd > 1:  # round 1: data loading, first-round state
                    for key, value in spent.items():
                        rows[name][key].append(value * 1000 / args.clients)
    import flower_pfl
    print(f"tree {flower_pfl.__file__}; {args.clients} clients, batch {args.batch_size}, "
          f"lr 0.005, min of {args.repeats} rounds after one warm-up, torch threads "
          f"{args.threads}\n{'ms per client message':24s}" + "".join(f"{n:>10s}" for n in names))
    for key in PHASES:
        cells = [f"{min(rows[n][key]):10.2f}" if rows[n].get(key) else f"{'-':>10s}"
                 for n in names]
        print(f"{key:24s}" + "".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strategies", nargs="+", default=["fedamp", "fedprox"])
    ap.add_argument("--phases", action="store_true",
                    help="ms per client message by phase (fedavg fedprox fedamp by default)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--subsample", type=int, default=None,
                    help="pooled images (default: all 70,000 FMNIST images)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1, as a Ray client actor with num-cpus 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.phases:
        phases(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        feds = {"fedavg": Federation(make_cfg("fedavg", args), f"{tmp}/fedavg")}
        for name in args.strategies:
            cfg = make_cfg(name, args)
            feds[f"{name}/autograd"] = Federation(cfg, f"{tmp}/{name}-a", autograd=True)
            feds[f"{name}/fused"] = Federation(cfg, f"{tmp}/{name}-f")
        order = list(feds)
        for fed in feds.values():  # warm-up round: data loading, first-round state
            fed.round()
        identical = {name: True for name in args.strategies}
        for rep in range(args.repeats):
            shift = rep % len(order)
            for key in order[shift:] + order[:shift]:
                feds[key].round()
            for name in args.strategies:  # both federations have now run rep + 2 rounds
                a, f = feds[f"{name}/autograd"].uploads, feds[f"{name}/fused"].uploads
                identical[name] &= a.keys() == f.keys() and all(
                    len(a[k]) == len(f[k]) and all(u == v for u, v in zip(a[k], f[k]))
                    for k in a)
            print(f"repeat {rep + 1}: " + ", ".join(
                f"{k} {feds[k].seconds[-1]:.3f}s" for k in order), flush=True)
    steps = feds["fedavg"].steps
    print(f"\nworkload: FMNIST DNN, pathological 2 classes, {args.clients} clients, batch "
          f"{args.batch_size}, 1 epoch ({steps:.0f} SGD steps per round), {args.repeats} "
          f"paired repeats after one warm-up round, torch threads {args.threads}")
    for label, attr in (("fit phase", "seconds"), ("round (fit + evaluate)", "round_seconds")):
        base = getattr(feds["fedavg"], attr)[1:]
        print(f"\n{label}: {'variant':18s} {'min s':>7s} {'median s':>8s} "
              f"{'ratio of mins':>13s} {'of medians':>10s} {'paired median':>13s}")
        for key in order:
            times = getattr(feds[key], attr)[1:]
            (mn, md), (bmn, bmd) = summary(times), summary(base)
            paired = statistics.median(t / b for t, b in zip(times, base))
            print(f"{'':{len(label) + 2}s}{key:18s} {mn:7.3f} {md:8.3f} {mn / bmn:13.2f} "
                  f"{md / bmd:10.2f} {paired:13.2f}")
    for name in args.strategies:
        print(f"{name}: autograd and fused uploads bit-for-bit identical in every round: "
              f"{identical[name]}")
    assert all(identical.values()), "the fused prox path diverged from autograd"


if __name__ == "__main__":
    main()
