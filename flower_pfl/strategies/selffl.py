"""Self-FL -- Chen et al., "Self-Aware Personalized Federated Learning", Algorithm 1.

Per round t (clients: clients/selffl.py):
  server -> client m: theta^{t-1}, sigma_0^2 and S_{-m} = sum_{k != m} (sigma_0^2 + sigma_k^2)^-1
  client m: sigma_m^2 by eq. 13; theta_m^INIT by eq. 10; (l_m, eta_m) by eq. 8 (clipped
            to l_max; eta_m solved from eq. 8 when one step of eta would overshoot);
            trains; returns theta_m^t, sigma_m^2 and -- 'bootstrap' estimator -- the
            offset d_m = theta_{m,t} - theta^{t-1} of its bootstrap local optimum (the
            upload's extra part OPTIMUM_OFFSET, checked by the base like a model array and
            bounded by max-update-norm: it is an update) and ||d_m||^2 (a metric)
  server:   sigma_0^2 by eq. 14: 'bootstrap' = empirical variance of the clients' LOCAL
            OPTIMA theta_{m,t} from the sums of d_m and ||d_m||^2 (section 3.2's
            definition); 'surrogate' = of the received personal models theta_m^t;
            theta_hat^t by eq. 11 over the active clients (weights (sigma_0^2+sigma_m^2)^-1);
            theta^t = (1 - C) theta^{t-1} + C theta_hat^t with C = fraction-fit (section 4.1).
Optional FedAvg warm-start rounds (section 3.2: "for large neural network models, we
suggest deploying Self-FL after the baseline FL training runs for certain rounds ... so
that the fluctuation of local models does not hinder variance approximation"): in the
first ``warmup-rounds`` rounds clients train one epoch from theta^{t-1} and the server
averages by sample size; eqs. 13-14 take samples only from the last PRIME_ROUNDS of them
on (eq. 13 needs two), so Self-FL starts with both variances known and none of the
warm-up's early fluctuation in them.  Under partial participation (fraction-fit < 1) a
client's FIRST participation fits FIRST_FITS bootstrap resamples (section 3.2's "u
independent samples"), so sigma_m^2 is known at once and eqs. 8/10 run from then on
instead of from its next turn, ~1/C rounds later.  ``oracle: true`` (synthetic task only)
replaces the estimates by the true sigma_0^2 and sigma_m^2 = noise^2 / N_m.
"""

from __future__ import annotations

import math
from collections import Counter
from logging import INFO
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
from flwr.common import Scalar
from flwr.common.logger import log

from flower_pfl.algorithms import selffl_math as sm
from flower_pfl.catalog import selffl as catalog
from flower_pfl.catalog.selffl import SelfFLFit, SelfFLReply
from flower_pfl.config import RunConfig
from flower_pfl.model_store import plan_from_config
from flower_pfl.registry import strategy_for
from flower_pfl.store_rows import RowMatrix
from flower_pfl.strategies.base import PersonalizedStrategy
from flower_pfl.strategies.federation import ClientUpdate

OPTIMUM_OFFSET = sm.OPTIMUM_OFFSET
PRIME_ROUNDS = 2  # warm-up rounds at the end of the warm-up that already sample eqs. 13-14
UNKNOWN = -1.0  # config values cannot be None: negative variance = not known yet
SIGMA0_DROP_ORDERS = 2.0  # warn when sigma_0^2 fell this many orders below its peak
#: bootstrap fits in a client's first participation when not every client takes part every
#: round (fraction-fit < 1): eq. 13's two samples at once (docs/algorithms/selffl.md)
FIRST_FITS = 2
#: eq. 8 rules under which eq. 8 itself set the client's steps (the others fall back)
EQ8_RAN = frozenset({sm.RULE_EQ8, sm.RULE_L_MAX, sm.RULE_ETA_GE_SIGMA, sm.RULE_BELOW_ONE})

#: server.csv column -> the client's eq. 8 rule it counts
RULE_COLUMNS = {
    "fallback_variance_unknown": sm.RULE_UNKNOWN,
    "fallback_eta_ge_sigma_sq": sm.RULE_ETA_GE_SIGMA,
    "fallback_steps_below_one": sm.RULE_BELOW_ONE,
    "fallback_l_max_clip": sm.RULE_L_MAX,
    "fallback_q0": sm.RULE_Q0,
    "fallback_q1": sm.RULE_Q1,
    "fallback_no_contraction": sm.RULE_NO_CONTRACTION,
}


def _median_known(values: Iterable[float]) -> float:
    """Median of the known (>= 0) values; NaN when none is known."""
    known = [float(v) for v in values if float(v) >= 0]
    return float(np.median(known)) if known else math.nan


@strategy_for(catalog.SELFFL)
class SelfFL(PersonalizedStrategy):
    """Visibility (nothing falls back silently): every round server.csv gets the count of each
    fallback (clients per eq. 8 rule, eq. 10 undefined, unknown sigma_m^2 in eq. 11, the
    unweighted mean, the FedAvg round) and ``selffl_clients.csv`` each client's rule,
    init_coef, l_m and eta_m; one INFO line per round sums them up.  Mechanism off: when
    sigma_0^2 falls SIGMA0_DROP_ORDERS orders of magnitude below its peak the personal
    models have collapsed onto the global model (Self-FL = FedAvg); the measure
    ``sigma0_sq_drop_orders`` is in server.csv and a WARNING names the hyper-parameter.
    Guards and fallbacks for every division/log: flower_pfl/algorithms/selffl_math.py.

    Memory: the server keeps no model per client; a round's uploads arrive serialised, are
    decoded one at a time into a float32 :class:`~flower_pfl.model_store.RowMatrix` (in
    memory, or a scratch file when larger than the model store's budget allows) and eqs. 11
    and the warm-up mean read it in column blocks (each column's result is the same as over
    the whole matrix).
    """

    #: uploads are decoded one at a time into the round's rows (strategies/base.py)
    lazy_uploads = True
    #: sigma_0^2 and its peak (the sigma_m^2 are in the ClientStore), and the choices
    #: ``setup`` made from the model (a resumed run does not call setup again)
    checkpointed: tuple[str, ...] = ("sigma0_sq", "sigma0_peak", "estimator", "contraction",
                                     "eq13_samples", "warmup_rounds", "oracle_sigma_sq")

    params: catalog.SelfFLParams

    def __init__(self, cfg: RunConfig, initial_arrays: Sequence[np.ndarray] | None = None,
                 results_dir: str | Path | None = None) -> None:
        super().__init__(cfg, initial_arrays, results_dir)
        hp = self.params
        self.sigma0_sq = math.nan  # eq. 14's estimate (NaN: none yet)
        self.sigma0_peak = math.nan  # its largest value so far (the mechanism-off measure)
        self.oracle_sigma_sq: np.ndarray | None = None  # oracle: the true sigma_m^2
        self.estimator = "oracle" if hp.oracle else hp.variance_estimator
        # the 'auto' choices below depend on the model's size: set in setup
        self.contraction = str(hp.contraction)
        self.eq13_samples = str(hp.eq13_samples)
        self.warmup_rounds = 0
        self.optima_missing = 0  # the round's uploads without d_m (eq. 14 leaves them out)

    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        # every 'auto' below: the paper's literal form on the scalar model of sections 2-3,
        # the deep-learning form (section 3.2) on a network
        network = self.spec.dim > 1
        boot_net = network and self.estimator == "bootstrap"
        auto_contraction = "measured" if boot_net else "variance"  # trace vs variance
        auto_eq13 = "offset" if boot_net else "optimum"  # the fit's start matters
        auto_warmup = int(self.cfg["rounds"]) // 4 if network else 0
        hp = self.params  # each: the hyper-parameter, or its 'auto' choice above
        self.contraction = auto_contraction if hp.contraction == "auto" else hp.contraction
        self.eq13_samples = auto_eq13 if hp.eq13_samples == "auto" else hp.eq13_samples
        # a string is 'auto' (validated: flower_pfl/catalog/selffl.py), likewise below
        self.warmup_rounds = int(auto_warmup if isinstance(hp.warmup_rounds, str)
                                 else hp.warmup_rounds)
        if hp.oracle:
            from flower_pfl.learning.data import gaussian_truth

            truth = gaussian_truth(self.cfg.values)
            self.sigma0_sq = truth.sigma0_sq
            self.oracle_sigma_sq = truth.sigma_sq
            for pid, value in enumerate(truth.sigma_sq):
                self.store.put("sigma_sq", pid, float(value))

    def mechanism_used(self, update: ClientUpdate, carried: bool) -> bool:
        """Eq. 8 set the client's steps (not a fallback rule) AND eq. 10's coefficient c_m
        was defined (> 0), whether or not the client had trained before."""
        reply = SelfFLReply.from_config(update.metrics)
        return reply.steps_rule in EQ8_RAN and (reply.init_coef or 0.0) > 0

    def warmup(self, server_round: int) -> bool:
        return server_round <= self.warmup_rounds

    def samples_variance(self, server_round: int) -> bool:
        """Whether this round's clients add a sample to eqs. 13-14 (not the early warm-up)."""
        return server_round > self.warmup_rounds - PRIME_ROUNDS

    def s_minus(self, pid: int) -> float:
        others = [v for k, v in self.store.values.get("sigma_sq", {}).items() if k != pid]
        if not math.isfinite(self.sigma0_sq) or not others:
            return math.nan
        return sm.s_minus(self.sigma0_sq, others)

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        s, hp = self.s_minus(pid), self.params
        assert self.global_arrays is not None, "Self-FL keeps a global model"
        return self.global_arrays, SelfFLFit(
            warmup=self.warmup(server_round),
            sample_variance=self.samples_variance(server_round),
            sigma0_sq=self.sigma0_sq if math.isfinite(self.sigma0_sq) else UNKNOWN,
            s_minus=s if math.isfinite(s) else UNKNOWN,
            eta=self.cfg["train.lr"] if isinstance(hp.eta, str) else hp.eta,  # str: 'auto'
            l_max=hp.l_max,
            variance_estimator=self.estimator,
            contraction=self.contraction,
            eq13_samples=self.eq13_samples,
            bootstrap_max_steps=hp.bootstrap_max_steps,
            bootstrap_tol=hp.bootstrap_tol,
            bootstrap_lr=-1.0 if isinstance(hp.bootstrap_lr, str) else hp.bootstrap_lr,
            oracle_sigma_sq=(self.oracle_sigma_sq[pid] if self.oracle_sigma_sq is not None
                             else UNKNOWN),
            # partial participation: a client's next turn is ~1/C rounds away, so its first
            # participation takes eq. 13's two samples at once (clients/selffl.py)
            first_fits=FIRST_FITS if float(self.cfg["fraction-fit"]) < 1.0 else 1,
        ).to_config()

    def upload_extra(self, server_round: int) -> dict[str, list[np.ndarray]]:
        """d_m in the rounds whose clients run the bootstrap fit (template: no memory)."""
        if self.estimator != "bootstrap" or not self.samples_variance(server_round):
            return {}
        return {OPTIMUM_OFFSET: [np.broadcast_to(np.float32(0), (self.spec.dim,))]}

    def bounded_extra(self) -> frozenset[str]:
        return frozenset({OPTIMUM_OFFSET})  # d_m is an update: max-update-norm bounds it

    def optimum_offset(self, u: ClientUpdate) -> np.ndarray | None:
        """d_m = theta_{m,t} - theta^{t-1} (the upload's extra part, shape and NaN/Inf
        checked by the base), or None without it or ||d_m||^2: then left out of eq. 14."""
        part, sq = u.extra.get(OPTIMUM_OFFSET), SelfFLReply.from_config(u.metrics).optimum_sq_norm
        if not part or sq is None or not math.isfinite(sq):
            return None
        return np.asarray(part[0], dtype=np.float32).astype(np.float64)

    def estimate_sigma0_sq(self, models: RowMatrix, updates: list[ClientUpdate]) -> float:
        """Eq. 14 over this round's clients: local optima (bootstrap) or personal models
        (the surrogate reads the round's models as one float64 array)."""
        # a RowMatrix where variance_across declares an ndarray (np.asarray reads it)
        if self.estimator != "bootstrap":
            return sm.variance_across(models)  # type: ignore[arg-type]  # RowMatrix, above
        total, sq, n = np.zeros(self.spec.dim), 0.0, 0
        for u in updates:
            offset = self.optimum_offset(u)
            if offset is not None:
                total += offset
                sq += float(SelfFLReply.from_config(u.metrics).optimum_sq_norm or 0.0)
                n += 1
        self.optima_missing = len(updates) - n
        return sm.variance_from_sums(total, sq, n)

    def round_models(self, updates: list[ClientUpdate]) -> RowMatrix:
        """The round's uploads as float32 rows, decoded one at a time: in memory, or in a
        scratch file under <results>/state when they exceed the model store's output
        budget (flower_pfl/model_store.py; the same ``server.*`` keys as FedAMP's store)."""
        plan = plan_from_config(self.cfg.values, len(updates), self.spec.dim)
        models = RowMatrix(len(updates), self.spec.dim, plan,
                           self.results.dir / "state" / "selffl-round.bin")
        for k, u in enumerate(updates):
            models.write(k, self.spec.flatten(u.arrays))
        return models

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        self.optima_missing = 0
        rows = self.round_models(updates)  # eqs. 11/14 read it in column blocks
        sigma_sq = np.array([SelfFLReply.from_config(u.metrics).sigma_sq for u in updates])
        sigma_sq[sigma_sq < 0] = np.nan
        for u, value in zip(updates, sigma_sq):
            if np.isfinite(value):
                self.store.put("sigma_sq", u.pid, float(value))
        if self.estimator != "oracle" and self.samples_variance(server_round):
            estimate = self.estimate_sigma0_sq(rows, updates)  # eq. 14
            if np.isfinite(estimate):
                self.sigma0_sq = estimate
        assert self.global_arrays is not None, "Self-FL keeps a global model"
        previous = self.spec.flatten(self.global_arrays).astype(np.float64)
        warmup = self.warmup(server_round)
        weights_rule = "FedAvg (warm-up)"
        theta = np.empty(self.spec.dim, dtype=np.float64)
        if warmup:  # FedAvg: the sample-weighted mean
            share = np.array([u.num_examples for u in updates], dtype=np.float64)
            share /= share.sum()
            for c0, c1, models in rows.blocks(np.float64):
                theta[c0:c1] = np.tensordot(share, models, axes=1)
        else:
            s0 = self.sigma0_sq if math.isfinite(self.sigma0_sq) else 0.0
            # sigma_sq: an array where selffl_math declares Sequence[float] (np.asarray reads it)
            _, weights_rule = sm.precision_weights_explained(
                s0, sigma_sq)  # type: ignore[arg-type]  # an array: see the line above
            for c0, c1, models in rows.blocks(np.float64):  # columns c0:c1 of every upload
                # eq. 11 (sigma_sq: an array, as above)
                theta_hat = sm.aggregate(models, s0, sigma_sq)  # type: ignore[arg-type]  # ndarray
                theta[c0:c1] = sm.smooth(previous[c0:c1], theta_hat,
                                         float(self.cfg["fraction-fit"]))
        rows.close()
        self.global_arrays = self.spec.unflatten(np.asarray(theta, dtype=np.float32))
        self.report(server_round, updates, sigma_sq, warmup, weights_rule)

    # ------------------------------------------------------------------ visibility
    def report(self, server_round: int, updates: list[ClientUpdate], sigma_sq: np.ndarray,
               warmup: bool, weights_rule: str) -> None:
        """Counts of every fallback, the mechanism-off measure, per-client rules."""
        replies = [SelfFLReply.from_config(u.metrics) for u in updates]
        rules = Counter(r.steps_rule or "" for r in replies)
        coefs = np.array([r.init_coef or 0.0 for r in replies])
        steps = [r.local_steps or 0.0 for r in replies]
        etas = np.array([math.nan if r.eta_m is None else r.eta_m for r in replies])
        if not np.isfinite(etas).any():
            etas = np.zeros(1)
        known = sigma_sq[np.isfinite(sigma_sq)]
        counts = {col: rules.get(rule, 0) for col, rule in RULE_COLUMNS.items()}
        counts.update(
            fallback_init_global=0 if warmup else int((coefs == 0).sum()),
            fallback_sigma_unknown_eq11=0 if warmup else int((~np.isfinite(sigma_sq)).sum()),
            fallback_unweighted_mean=int(weights_rule == sm.WEIGHTS_UNWEIGHTED),
            fallback_optimum_missing=self.optima_missing,
            fedavg_round=int(warmup))
        if math.isfinite(self.sigma0_sq):
            self.sigma0_peak = self.sigma0_sq if not math.isfinite(self.sigma0_peak) \
                else max(self.sigma0_peak, self.sigma0_sq)
        drop = sm.orders_of_magnitude_drop(self.sigma0_peak, self.sigma0_sq)
        boot = [r for r in replies if r.bootstrap_steps is not None]
        extra = {}
        if boot:
            extra = dict(
                bootstrap_steps_mean=float(np.mean([r.bootstrap_steps for r in boot])),
                bootstrap_converged=int(sum(bool(r.bootstrap_converged) for r in boot)),
                bootstrap_s_mean=float(np.mean([r.bootstrap_s for r in boot])),
                curvature_median=_median_known([-1.0 if r.curvature is None else r.curvature
                                                for r in boot]),
                upload_extra_bytes=4 * self.spec.dim + 8)  # d_m (float32) and ||d_m||^2
        self.log_server(sigma0_sq=self.sigma0_sq, sigma0_sq_drop_orders=drop,
                        variance_estimator=self.estimator, contraction=self.contraction,
                        eq13_samples=self.eq13_samples,
                        sigma_m_sq_min=float(known.min()) if known.size else math.nan,
                        sigma_m_sq_median=float(np.median(known)) if known.size else math.nan,
                        sigma_m_sq_max=float(known.max()) if known.size else math.nan,
                        local_steps_min=min(steps), local_steps_mean=float(np.mean(steps)),
                        local_steps_max=max(steps), eta_m_min=float(np.nanmin(etas)),
                        eta_m_max=float(np.nanmax(etas)), init_coef_mean=float(coefs.mean()),
                        warmup=warmup, **counts, **extra)
        self.results.log_table("selffl_clients", [
            {"round": server_round, "partition-id": u.pid, "steps_rule": r.steps_rule,
             "local_steps": r.local_steps, "eta_m": r.eta_m, "init_coef": r.init_coef,
             "sigma_sq": float(s), "curvature": r.curvature}
            for u, r, s in zip(updates, replies, sigma_sq)])
        fallbacks = ", ".join(f"{col.removeprefix('fallback_')} {n}" for col, n in counts.items()
                              if n) or "none"
        log(INFO, "[flower-pfl] selffl round %d: sigma_0^2 %.4g (%s, %.1f orders below peak) | "
            "sigma_m^2 median %.4g | l_m %d-%d | eta_m %.3g-%.3g | init_coef mean %.3g | "
            "fallbacks: %s", server_round, self.sigma0_sq, self.estimator, drop,
            float(np.median(known)) if known.size else math.nan, min(steps), max(steps),
            float(np.nanmin(etas)), float(np.nanmax(etas)), float(coefs.mean()), fallbacks)
        if drop >= SIGMA0_DROP_ORDERS:
            fix = ("set hyper.selffl.variance-estimator=bootstrap (the surrogate measures the "
                   "spread of the personal models, which Self-FL itself shrinks)"
                   if self.estimator == "surrogate" else
                   "raise hyper.selffl.bootstrap-max-steps (or lower hyper.selffl.bootstrap-tol) "
                   "so the bootstrap fits reach their local optima")
            self.warn_once(
                "collapse", "[flower-pfl] selffl round %d: sigma_0^2 fell %.1f orders of "
                "magnitude (%.3g -> %.3g): the personal models are collapsing onto the global "
                "model and Self-FL is running as FedAvg; %s", server_round, drop,
                self.sigma0_peak, self.sigma0_sq, fix)
