"""A membership-inference attack that must fail under sample-level DP (docs/privacy.md,
"A membership-inference check"; issue #52).

What is attacked: the model client 0 UPLOADS in the last round of a real federation run by
the project's own machinery (:func:`flower_pfl.running.inprocess.run`: the strategy, the
ClientApp, Flower's message path; a recording transport keeps the upload) -- what the
sample-level threat model hands to an honest-but-curious server.  Members: client 0's
training records; non-members: its held-out test split (the same distribution: a stratified
split of the same shard).  The attack: the loss threshold of Yeom et al. (CSF 2018):
a record is called a member when the model's cross-entropy on it is low.  Its success:
ROC AUC (0.5 = chance) and the membership advantage max_t (TPR - FPR) (Yeom et al., Def. 4),
scikit-learn's ``roc_auc_score``/``roc_curve``.  Chance for these set sizes: the 95th
percentile of both for scores that carry no membership signal (one seed, and the mean of
the seeds), printed above the table.

The setting is chosen to overfit with DP off (few records per client, many local epochs,
the DNN); the DP runs change nothing but ``privacy.*``: the noise multiplier for a target
ε is calibrated with opacus' ``get_noise_multiplier`` (RDP, the accountant the client
uses) at δ = 1/n_0 over every DP-SGD step client 0 takes, and the ε client 0 reports
(fit.csv ``dp_epsilon``) is printed.  Needs scikit-learn (``pip install scikit-learn``).

    .venv/bin/python benchmarks/dp_attack.py [--seeds 0 1 2] [--epsilons inf 8 1]
        [--rounds 1] [--epochs 60] [--subsample 400] [--lr 0.1]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: the attacked client (its partition id)
TARGET = 0


# ------------------------------------------------------------------ scoring (pure numpy)
def _labelled(member_losses: Sequence[float], nonmember_losses: Sequence[float]
              ) -> tuple[np.ndarray, np.ndarray]:
    """(labels, scores): 1 for a member, 0 for a non-member; score = -loss (a lower loss
    says "member").  Raises ValueError when either set is empty or a loss is not finite."""
    members = np.asarray(member_losses, dtype=np.float64).ravel()
    others = np.asarray(nonmember_losses, dtype=np.float64).ravel()
    if not len(members) or not len(others):
        raise ValueError(f"membership scoring needs members and non-members, got "
                         f"{len(members)} and {len(others)}")
    scores = -np.concatenate([members, others])
    if not np.all(np.isfinite(scores)):
        raise ValueError("membership scoring: a loss is NaN or infinite")
    labels = np.concatenate([np.ones(len(members)), np.zeros(len(others))])
    return labels, scores


def attack_auc(member_losses: Sequence[float], nonmember_losses: Sequence[float]) -> float:
    """ROC AUC of the loss-threshold attack: P(loss of a random member < loss of a random
    non-member), ties counted 1/2 (scikit-learn ``roc_auc_score`` on score = -loss).
    0.5: chance; 1: every member below every non-member; < 0.5: members have the higher
    losses.  Inputs: 1-D per-record losses (nats); raises ValueError as :func:`_labelled`."""
    from sklearn.metrics import roc_auc_score

    labels, scores = _labelled(member_losses, nonmember_losses)
    return float(roc_auc_score(labels, scores))


def attack_advantage(member_losses: Sequence[float], nonmember_losses: Sequence[float]
                     ) -> float:
    """Membership advantage of the best loss threshold, max_t (TPR(t) - FPR(t)) over every
    threshold t ("member" when loss <= t; Yeom et al. 2018, Def. 4), in [0, 1] (the
    threshold above every loss gives 0).  scikit-learn ``roc_curve`` on score = -loss."""
    from sklearn.metrics import roc_curve

    labels, scores = _labelled(member_losses, nonmember_losses)
    fpr, tpr, _ = roc_curve(labels, scores)
    return float(max(0.0, np.max(tpr - fpr)))


def bootstrap_auc(per_seed: Sequence[tuple[np.ndarray, np.ndarray]], draws: int,
                  rng: np.random.Generator, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the seed-mean AUC, members and non-members of each seed
    resampled with replacement (``draws`` times); the trained models stay fixed, so it is
    the interval of the attack's estimate on these models, not over training runs."""
    means = np.empty(draws)
    for d in range(draws):
        aucs = [attack_auc(m[rng.integers(0, len(m), len(m))],
                           o[rng.integers(0, len(o), len(o))]) for m, o in per_seed]
        means[d] = np.mean(aucs)
    tail = (1.0 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))


def chance_levels(n_members: int, n_nonmembers: int, draws: int, rng: np.random.Generator,
                  seeds: int = 1, quantile: float = 0.95) -> tuple[float, float]:
    """The ``quantile`` of (AUC, advantage), each averaged over ``seeds`` independent sets,
    of scores that carry no membership signal (i.i.d. scores, members and non-members drawn
    alike) for these set sizes: what "near chance" means for a table's seed mean.  The
    advantage of pure noise is not 0: the best of many thresholds is picked after the fact."""
    aucs, advs = np.empty(draws), np.empty(draws)
    for d in range(draws):
        runs = [rng.random(n_members + n_nonmembers) for _ in range(seeds)]
        aucs[d] = np.mean([attack_auc(r[:n_members], r[n_members:]) for r in runs])
        advs[d] = np.mean([attack_advantage(r[:n_members], r[n_members:]) for r in runs])
    return float(np.quantile(aucs, quantile)), float(np.quantile(advs, quantile))


# ------------------------------------------------------------------ the federation
def setting(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The run's configuration without ``privacy`` (every DP level shares it)."""
    return {"strategy": args.strategy, "rounds": args.rounds, "clients": args.clients,
            "fraction-fit": 1.0, "min-fit-clients": args.clients, "seed": seed,
            "model": "dnn", "eval-every": args.rounds, "eval-global": False,
            "checkpoint-every": 0, "device": "cpu",
            "data": {"dataset": "fmnist", "partition": "iid", "subsample": args.subsample,
                     "test-fraction": 0.5},
            "train": {"epochs": args.epochs, "batch-size": args.batch_size, "lr": args.lr}}


def calibrate(target_epsilon: float, n_train: int, batch_size: int, steps: int) -> float:
    """The noise multiplier z whose ``steps`` DP-SGD steps at q = batch / n_train reach
    ``target_epsilon`` at δ = 1/n_train (opacus ``get_noise_multiplier``, RDP accountant:
    the one the client reports its ε with)."""
    from opacus.accountants.utils import get_noise_multiplier

    return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=1 / n_train,
                                      sample_rate=min(1.0, batch_size / n_train), steps=steps,
                                      accountant="rdp"))


def per_record_losses(arrays: list[np.ndarray], values: Any, x: Any, y: Any) -> np.ndarray:
    """Cross-entropy (nats) of each record under the model ``arrays`` (the configured model,
    its weights set from the upload), in record order."""
    import torch
    import torch.nn.functional as F

    from flower_pfl.learning.client_data import dense
    from flower_pfl.learning.layers import set_arrays
    from flower_pfl.learning.models import model_for

    model = model_for(values)
    set_arrays(model, arrays)
    model.eval()
    with torch.no_grad():
        logits = model(dense(x).float())
        return F.cross_entropy(logits, y.long(), reduction="none").numpy().astype(np.float64)


def attacked_run(conf: dict[str, Any], out: Path) -> tuple[list[np.ndarray], float | None]:
    """Run ``conf`` in process; return client TARGET's last upload (its arrays) and the ε it
    reported then (fit.csv ``dp_epsilon``; None without DP)."""
    from flwr.common import parameters_to_ndarrays

    from flower_pfl import config as config_mod
    from flower_pfl.reporting.run_files import read_rows
    from flower_pfl.running import inprocess

    uploads: list[list[np.ndarray]] = []

    class Recording(inprocess.InProcessProxy):
        """The in-process transport, keeping what TARGET sends the server."""

        def fit(self, ins, timeout, group_id):
            res = super().fit(ins, timeout, group_id)
            if int(self.context.node_config["partition-id"]) == TARGET:
                uploads.append(parameters_to_ndarrays(res.parameters))
            return res

    cfg = config_mod.validate(conf, source="benchmarks/dp_attack.py")
    manager = inprocess.make_federation(cfg["clients"], proxy_cls=Recording,
                                        run_config={"client-state-dir": "",
                                                    "cfg": cfg.to_json()})
    strategy = inprocess.run(cfg, out, manager=manager, cfg_travels=False)
    if len(uploads) != cfg["rounds"]:
        raise RuntimeError(f"client {TARGET} uploaded {len(uploads)} times in "
                           f"{cfg['rounds']} rounds")
    rows = [r for r in read_rows(strategy.results.dir, "fit")
            if int(r["partition-id"]) == TARGET and int(r["round"]) == cfg["rounds"]]
    eps = rows[0].get("dp_epsilon") if rows else None
    return uploads[-1], (float(eps) if eps not in (None, "") else None)


def one_level(args: argparse.Namespace, target: float, seed: int, out: Path
              ) -> dict[str, Any]:
    """Train at ``target`` ε (inf: no DP) with ``seed`` and attack client TARGET's upload:
    its AUC, advantage, the ε it reported, its train/test accuracy, the member and
    non-member losses."""
    import torch

    from flower_pfl import config as config_mod
    from flower_pfl.learning.client_data import load_client_data

    conf = setting(args, seed)
    values = config_mod.validate(conf, source="benchmarks/dp_attack.py").values
    data = load_client_data(values, TARGET, None, torch.device("cpu"))
    z = None
    if math.isfinite(target):
        steps = args.rounds * args.epochs * -(-data.num_train // args.batch_size)
        z = calibrate(target, data.num_train, args.batch_size, steps)
        conf["privacy"] = {"mode": "sample-level", "noise-multiplier": z,  # δ = 1/n_0, as
                           "max-grad-norm": args.max_grad_norm,  # calibrated (and warned)
                           "delta": 1 / data.num_train}
    arrays, eps = attacked_run(conf, out / f"eps{target:g}-seed{seed}")
    members = per_record_losses(arrays, values, data.x_train, data.y_train)
    others = per_record_losses(arrays, values, data.x_test, data.y_test)

    def accuracy(x, y) -> float:
        from flower_pfl.learning.client_data import dense
        from flower_pfl.learning.layers import set_arrays
        from flower_pfl.learning.models import model_for

        model = model_for(values)
        set_arrays(model, arrays)
        model.eval()
        with torch.no_grad():
            return float((model(dense(x).float()).argmax(1) == y).float().mean())

    return {"z": z, "epsilon": eps, "members": members, "others": others,
            "auc": attack_auc(members, others), "advantage": attack_advantage(members, others),
            "train_acc": accuracy(data.x_train, data.y_train),
            "test_acc": accuracy(data.x_test, data.y_test)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[math.inf, 8.0, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--strategy", default="fedavg")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=60, help="local epochs per round")
    parser.add_argument("--subsample", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--bootstrap", type=int, default=200)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(12345)
    print(f"membership inference (loss threshold) on client {TARGET}'s last upload: "
          f"{args.strategy}, {args.clients} clients, {args.rounds} rounds x {args.epochs} "
          f"local epochs, FMNIST iid subsample {args.subsample} (test-fraction 0.5), dnn, "
          f"batch {args.batch_size}, lr {args.lr}, max-grad-norm {args.max_grad_norm}; "
          f"seeds {args.seeds}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="dp-attack-") as tmp:
        for target in args.epsilons:
            runs = [one_level(args, target, seed, Path(tmp)) for seed in args.seeds]
            lo, hi = bootstrap_auc([(r["members"], r["others"]) for r in runs],
                                   args.bootstrap, rng)
            rows.append((target, runs, lo, hi))
    n_m, n_o = len(rows[0][1][0]["members"]), len(rows[0][1][0]["others"])
    auc95, adv95 = chance_levels(n_m, n_o, 1000, rng)
    mean95, madv95 = chance_levels(n_m, n_o, 1000, rng, seeds=len(args.seeds))
    print(f"{n_m} members, {n_o} non-members per seed; chance (95th percentile of no-signal "
          f"scores): one seed AUC {auc95:.3f}, advantage {adv95:.3f}; mean of "
          f"{len(args.seeds)} seeds AUC {mean95:.3f}, advantage {madv95:.3f}")
    print("| target ε | z | ε reached (max) | AUC mean [95% bootstrap] | AUC per seed "
          "| advantage mean | train acc | test acc |")
    print("|---|---|---|---|---|---|---|---|")
    for target, runs, lo, hi in rows:
        zs = "-" if runs[0]["z"] is None else f"{runs[0]['z']:.3f}"
        eps = [r["epsilon"] for r in runs if r["epsilon"] is not None]
        reached = f"{max(eps):.3f}" if eps else "-"
        print(f"| {target:g} | {zs} | {reached} | "
              f"{np.mean([r['auc'] for r in runs]):.3f} [{lo:.3f}, {hi:.3f}] | "
              f"{', '.join(format(r['auc'], '.3f') for r in runs)} | "
              f"{np.mean([r['advantage'] for r in runs]):.3f} | "
              f"{np.mean([r['train_acc'] for r in runs]):.3f} | "
              f"{np.mean([r['test_acc'] for r in runs]):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
