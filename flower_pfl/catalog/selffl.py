"""Self-FL (Chen et al.): uncertainty-weighted aggregation.

Each default is the paper's where it gives one; the others are our choices, explained in
words here and measured in docs/algorithms/selffl.md (the section each ``doc`` names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from flower_pfl.catalog import refusals
from flower_pfl.contract import (
    PER_UPLOAD,
    POS,
    Decision,
    Entry,
    Mechanism,
    Params,
    auto_or_positive,
    in_,
    param,
)
from flower_pfl.fields import OPEN_FRACTION
from flower_pfl.instructions import Reply, Wire

ESTIMATORS = ("bootstrap", "surrogate")
CONTRACTIONS = ("auto", "measured", "variance")
EQ13_SAMPLES = ("auto", "optimum", "offset")


def AUTO_OR_NONNEG(v: Any) -> bool:  # noqa: N802 - a range check, named as the tables read it
    """The range check of warmup-rounds: ``'auto'`` or a number >= 0."""
    return bool(v == "auto" or (not isinstance(v, str) and v >= 0))


@dataclass(frozen=True)
class SelfFLParams(Params):
    """hyper.selffl."""

    eta: str | float = auto_or_positive(
        "step size eta of eqs. 5/8 (the local SGD learning rate); 'auto' = train.lr")
    l_max: int = param(50, POS, "an integer >= 1",
                       "upper clip of the local steps l_m of eq. 8 (section 4.2)")
    warmup_rounds: str | int = param(
        "auto", AUTO_OR_NONNEG, "'auto' or an integer >= 0",
        "FedAvg rounds before Self-FL starts (section 3.2's warm start, suggested "
        "'for large neural network models ... so that the fluctuation of local models "
        "does not hinder variance approximation'); eqs. 13-14 sample only from the "
        "last two of them on. 'auto' = a quarter of the rounds on a model of more "
        "than one parameter (on FMNIST the warm start is what lifted Self-FL above "
        "FedAvg and Local; a quarter is the one fraction measured, not a tuned optimum: "
        "docs/algorithms/selffl.md, 'FMNIST, bootstrap estimator'), 0 on the scalar "
        "synthetic task (the Gaussian model has no fluctuation to wait out)")
    variance_estimator: Literal["bootstrap", "surrogate"] = param(
        "bootstrap", in_(ESTIMATORS), f"one of {list(ESTIMATORS)}",
        "what eqs. 13-14 are taken over (section 3.2): 'bootstrap' = local optima of a "
        "copy trained on a bootstrap resample each round (the paper's definition); "
        "'surrogate' = the personal models theta_m^t (the paper's cost-saving "
        "suggestion). Default bootstrap: the surrogate measures the spread of the "
        "personal models, which Self-FL itself shrinks, so sigma_0^2 collapses and "
        "Self-FL becomes FedAvg (docs/algorithms/selffl.md, 'What sigma_m^2 and "
        "sigma_0^2 are estimated from')")
    bootstrap_max_steps: int = param(
        50, POS, "an integer >= 1",
        "step cap of the bootstrap fit (the paper gives none: 'sufficiently many "
        "steps'); 50 = the l-max default, so the fit costs at most what the personal "
        "training may cost. On a network mini-batch SGD rarely meets the gradient "
        "rule and this cap is what ends the fit; the synthetic config raises it to "
        "1000 so that the rule ends it (docs/algorithms/selffl.md, 'What sigma_m^2 and "
        "sigma_0^2 are estimated from')")
    bootstrap_lr: str | float = auto_or_positive(
        "SGD step size of the bootstrap fit; 'auto' = eta. Only the optimum it reaches "
        "matters (not how), so a larger step that still converges just saves steps; "
        "the synthetic config uses a larger one for that reason (docs/algorithms/"
        "selffl.md, 'What sigma_m^2 and sigma_0^2 are estimated from')")
    bootstrap_tol: float = param(
        0.01, OPEN_FRACTION, "a number in (0, 1)",
        "the bootstrap fit stops when its mean gradient norm over one pass has fallen "
        "to this fraction of the first pass's (ours; 0.01 leaves 1% of the initial "
        "distance on a quadratic)")
    contraction: Literal["auto", "measured", "variance"] = param(
        "auto", in_(CONTRACTIONS), f"one of {list(CONTRACTIONS)}",
        "the per-step contraction 1 - eta h_m of eq. 8: 'variance' = the paper's "
        "h_m = sigma_m^-2 (exact for the Gaussian model); 'measured' = h_m from how "
        "fast the round's bootstrap fit contracted (needs the bootstrap estimator; "
        "with a trace variance over a network's parameters eq. 8 literally gives one "
        "step: docs/algorithms/selffl.md, 'Eq. 8 on a network'); 'auto' = measured "
        "with the bootstrap "
        "estimator on a model of more than one parameter (where sigma_m^2 is a "
        "trace), variance otherwise (the scalar synthetic task, the surrogate, the "
        "oracle)")
    eq13_samples: Literal["auto", "optimum", "offset"] = param(
        "auto", in_(EQ13_SAMPLES), f"one of {list(EQ13_SAMPLES)}",
        "what eq. 13's running variance is taken over with the bootstrap estimator: "
        "'optimum' = the local optima theta_{m,t} themselves (literal); 'offset' = "
        "their offsets theta_{m,t} - theta^{t-1} to the round's global model (the "
        "samples eq. 14 already uses), so the global model's drift over the rounds "
        "does not count as client noise; 'auto' = offset on a model of more than one "
        "parameter (a network's 50-step fit depends on where it starts), optimum on "
        "the scalar synthetic task (its fit converges to the same optimum from "
        "anywhere). See docs/algorithms/selffl.md")
    oracle: bool = param(False, None, "true or false",
                         "synthetic task only: use the true sigma_0^2 and sigma_m^2 = "
                         "noise^2/N_m instead of the estimates of eqs. 13-14")


# ------------------------------------------- messages (server -> client, client -> server)
@dataclass(frozen=True)
class SelfFLFit(Wire):
    """Self-FL (eqs. 8, 10, 13-14): the server's variances (-1: not known yet), the step
    rule's inputs and the bootstrap fit's settings (strategies/selffl.py)."""

    warmup: bool  # FedAvg steps from the global model (no eq. 8/10 yet)
    sample_variance: bool  # this round's fit adds a sample to eq. 13
    sigma0_sq: float  # eq. 14's sigma_0^2 (-1: unknown)
    s_minus: float  # sum over the other clients (-1: unknown)
    eta: float  # the local learning rate of eq. 8
    l_max: int  # eq. 8's step cap
    variance_estimator: str  # 'bootstrap' | 'surrogate' | 'oracle'
    contraction: str  # 'measured' | 'variance'
    eq13_samples: str  # 'offset' | 'optimum'
    bootstrap_max_steps: int
    bootstrap_tol: float
    bootstrap_lr: float  # -1: eta
    oracle_sigma_sq: float  # the true sigma_m^2 (oracle runs; -1 otherwise)
    first_fits: int = 1  # bootstrap fits on a first participation


@dataclass(frozen=True, kw_only=True)
class SelfFLReply(Reply):
    """Self-FL's fit metrics the server reads (eq. 14's inputs, the step rule's outcome),
    in the order the client sends them (the bootstrap fit's first)."""

    bootstrap_steps: float | None = None
    bootstrap_converged: bool | None = None
    bootstrap_s: float | None = None
    curvature: float | None = None  # measured contraction's curvature (-1: unknown)
    bootstrap_fits: int | None = None  # > 1 on a first participation
    optimum_sq_norm: float | None = None  # ||d_m||^2 (bootstrap rounds)
    sigma_sq: float  # the client's sigma_m^2 (-1: unknown): eq. 11 needs it
    # always sent; read for the report only (a reply without them still aggregates)
    local_steps: float | None = None
    init_coef: float | None = None  # eq. 10's c_m
    eta_m: float | None = None
    steps_rule: str | None = None  # which rule set the steps (selffl_math.RULE_*)


SELFFL = Entry(
    "selffl",
    "Self-FL (Chen et al.): uncertainty-driven local initialisation (eq. 10), local steps "
    "(eq. 8) and variance-weighted aggregation (eq. 11) with smoothing under sampling; "
    "variances from bootstrapped local optima (eqs. 13-14, section 3.2).",
    params=SelfFLParams,
    cross_check=lambda values, hyper: (
        ["'hyper.selffl.oracle' = true needs data.dataset 'synthetic-gaussian' (only there "
         "are the true variances known)"]
        if hyper.get("oracle") and values["data.dataset"] != "synthetic-gaussian" else []) + (
        ["'hyper.selffl.contraction' = 'measured' needs variance-estimator 'bootstrap' (the "
         "contraction is measured on the bootstrap fit)"]
        if hyper.get("contraction") == "measured"
        and hyper.get("variance-estimator", "bootstrap") != "bootstrap" else []),
    refuses=refusals({
        "train.optimizer": "Self-FL's eq. 8 (Chen et al., section 3.3) sets the local step count "
                           "l_m and step size eta_m for plain gradient steps on the local loss, "
                           "whose contraction (1 - eta_m/sigma_m^2)^l_m is what eq. 8 solves; "
                           "an adaptive optimizer's step is not that contraction",
        "train.lr-schedule": "Self-FL's eq. 8 (Chen et al., section 3.3) sets each round's step "
                             "size eta_m from the variances and hyper eta; train.lr (and so its "
                             "schedule) acts only in the FedAvg warm-up rounds"}),
    privacy=Decision(
        "theta_m, the offset d_m and sigma_m^2",
        PER_UPLOAD.format(what="each theta_m is weighted by its own sigma_m^2"),
        "its clients upload sigma_m^2 and d_m computed from bootstrap fits outside the DP-SGD "
        "loop, and the server weights by them: no mode protects Self-FL here"),
    mechanism=Mechanism("Self-FL", "eq. 8/10", "configured steps at eta from the global "
                        "model, i.e. FedAvg's local update",
                        "run more rounds than hyper.selffl.warmup-rounds or raise fraction-fit"),
    wire=(SelfFLFit, SelfFLReply),
)

ENTRIES = [SELFFL]
