"""Self-FL (Chen et al.): uncertainty-weighted aggregation.

Each default is the paper's where it gives one; the others are our choices, explained in
words here and measured in docs/algorithms/selffl.md (the section each ``doc`` names).
"""

from __future__ import annotations

from flower_pfl.catalog import refusals
from flower_pfl.contract import Entry
from flower_pfl.hyper import NUM, POS, Hyper, auto_or_positive

ESTIMATORS = ("bootstrap", "surrogate")
CONTRACTIONS = ("auto", "measured", "variance")
EQ13_SAMPLES = ("auto", "optimum", "offset")

SELFFL = Entry(
    "selffl",
    "Self-FL (Chen et al.): uncertainty-driven local initialisation (eq. 10), local steps "
    "(eq. 8) and variance-weighted aggregation (eq. 11) with smoothing under sampling; "
    "variances from bootstrapped local optima (eqs. 13-14, section 3.2).",
    {
        "eta": auto_or_positive(
            "step size eta of eqs. 5/8 (the local SGD learning rate); 'auto' = train.lr"),
        "l-max": Hyper(50, (int,), POS, "an integer >= 1",
                       "upper clip of the local steps l_m of eq. 8 (section 4.2)"),
        "warmup-rounds": Hyper(
            "auto", (str, int),
            lambda v: v == "auto" or (not isinstance(v, str) and v >= 0),
            "'auto' or an integer >= 0",
            "FedAvg rounds before Self-FL starts (section 3.2's warm start, suggested "
            "'for large neural network models ... so that the fluctuation of local models "
            "does not hinder variance approximation'); eqs. 13-14 sample only from the "
            "last two of them on. 'auto' = a quarter of the rounds on a model of more "
            "than one parameter (on FMNIST the warm start is what lifted Self-FL above "
            "FedAvg and Local; a quarter is the one fraction measured, not a tuned optimum: "
            "docs/algorithms/selffl.md, 'FMNIST, bootstrap estimator'), 0 on the scalar "
            "synthetic task (the Gaussian model has no fluctuation to wait out)"),
        "variance-estimator": Hyper(
            "bootstrap", (str,), lambda v: v in ESTIMATORS, f"one of {list(ESTIMATORS)}",
            "what eqs. 13-14 are taken over (section 3.2): 'bootstrap' = local optima of a "
            "copy trained on a bootstrap resample each round (the paper's definition); "
            "'surrogate' = the personal models theta_m^t (the paper's cost-saving "
            "suggestion). Default bootstrap: the surrogate measures the spread of the "
            "personal models, which Self-FL itself shrinks, so sigma_0^2 collapses and "
            "Self-FL becomes FedAvg (docs/algorithms/selffl.md, 'What sigma_m^2 and "
            "sigma_0^2 are estimated from')"),
        "bootstrap-max-steps": Hyper(
            50, (int,), POS, "an integer >= 1",
            "step cap of the bootstrap fit (the paper gives none: 'sufficiently many "
            "steps'); 50 = the l-max default, so the fit costs at most what the personal "
            "training may cost. On a network mini-batch SGD rarely meets the gradient "
            "rule and this cap is what ends the fit; the synthetic config raises it to "
            "1000 so that the rule ends it (docs/algorithms/selffl.md, 'What sigma_m^2 and "
            "sigma_0^2 are estimated from')"),
        "bootstrap-lr": auto_or_positive(
            "SGD step size of the bootstrap fit; 'auto' = eta. Only the optimum it reaches "
            "matters (not how), so a larger step that still converges just saves steps; "
            "the synthetic config uses a larger one for that reason (docs/algorithms/"
            "selffl.md, 'What sigma_m^2 and sigma_0^2 are estimated from')"),
        "bootstrap-tol": Hyper(
            0.01, NUM, lambda v: 0 < v < 1, "a number in (0, 1)",
            "the bootstrap fit stops when its mean gradient norm over one pass has fallen "
            "to this fraction of the first pass's (ours; 0.01 leaves 1% of the initial "
            "distance on a quadratic)"),
        "contraction": Hyper(
            "auto", (str,), lambda v: v in CONTRACTIONS, f"one of {list(CONTRACTIONS)}",
            "the per-step contraction 1 - eta h_m of eq. 8: 'variance' = the paper's "
            "h_m = sigma_m^-2 (exact for the Gaussian model); 'measured' = h_m from how "
            "fast the round's bootstrap fit contracted (needs the bootstrap estimator; "
            "with a trace variance over a network's parameters eq. 8 literally gives one "
            "step: docs/algorithms/selffl.md, 'Eq. 8 on a network'); 'auto' = measured "
            "with the bootstrap "
            "estimator on a model of more than one parameter (where sigma_m^2 is a "
            "trace), variance otherwise (the scalar synthetic task, the surrogate, the "
            "oracle)"),
        "eq13-samples": Hyper(
            "auto", (str,), lambda v: v in EQ13_SAMPLES, f"one of {list(EQ13_SAMPLES)}",
            "what eq. 13's running variance is taken over with the bootstrap estimator: "
            "'optimum' = the local optima theta_{m,t} themselves (literal); 'offset' = "
            "their offsets theta_{m,t} - theta^{t-1} to the round's global model (the "
            "samples eq. 14 already uses), so the global model's drift over the rounds "
            "does not count as client noise; 'auto' = offset on a model of more than one "
            "parameter (a network's 50-step fit depends on where it starts), optimum on "
            "the scalar synthetic task (its fit converges to the same optimum from "
            "anywhere). See docs/algorithms/selffl.md"),
        "oracle": Hyper(False, (bool,), None, "true or false",
                        "synthetic task only: use the true sigma_0^2 and sigma_m^2 = "
                        "noise^2/N_m instead of the estimates of eqs. 13-14"),
    },
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
)

ENTRIES = [SELFFL]
