"""Baselines the papers compare against: FedAvg, Local (Separate), FedAvg-FT, FedProx,
FedProx-FT, SCAFFOLD, APFL, Ditto, Per-FedAvg (docs/algorithms/baselines.md).

Defaults: the paper's value where the paper gives one for an MNIST-like task, otherwise a
value of the paper's own tuning grid (each ``doc`` says which).  A value that turns a
method into another one (mu = 0, lambda = 0, alpha = 0, a fixed APFL alpha of 0 or 1) is
rejected by the range checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flower_pfl.catalog import refusals
from flower_pfl.contract import (
    OWN_LOOP,
    POS,
    WHOLE_MODEL,
    Decision,
    Entry,
    Mechanism,
    Newcomer,
    Params,
    in_,
    param,
)
from flower_pfl.instructions import Wire, key

#: SCAFFOLD's option II turns the model change into a gradient estimate
SCAFFOLD_REFUSES = {
    "train.momentum": "SCAFFOLD's option II (Karimireddy et al. 2020, Alg. 1 line 12) sets "
                      "c_i+ = c_i - c + (x - y_i) / (K lr), the mean gradient of K steps: it "
                      "assumes plain SGD; with a momentum buffer the model change is no "
                      "longer K lr times that mean, and the control variates estimate "
                      "something else",
}
SCAFFOLD_REFUSES["train.optimizer"] = (
    "SCAFFOLD's option II (Karimireddy et al. 2020, Alg. 1 line 12) reads (x - y_i) / (K lr) as "
    "the mean gradient of K SGD steps; Adam's steps are not lr times a gradient, so the "
    "control variates would estimate something else")
#: APFL's update is three plain gradient steps per mini-batch
APFL_REFUSES = {
    key: "APFL (Deng et al. 2020, Alg. 1) takes, per mini-batch, one plain gradient step on w, "
         "one on v_i through the mixture alpha_i v_i + (1 - alpha_i) w and one on alpha_i, all "
         "at step eta (alpha-lr for alpha); the paper defines no momentum buffer, decay "
         "term or adaptive (Adam) step for the coupled (w, v_i, alpha_i) step, and its "
         "convergence analysis assumes plain SGD"
    for key in ("train.momentum", "train.weight-decay", "train.optimizer")
}
#: Per-FedAvg's meta-step is the gradient of the MAML objective
PERFEDAVG_REFUSES = {
    key: "Per-FedAvg (Fallah et al. 2020, Alg. 1) updates w by w - beta (I - alpha H) "
         "grad f(w - alpha grad f(w)), a plain step on the MAML objective F(w) = f(w - alpha "
         "grad f(w)), and personalizes by plain steps of size alpha; momentum, weight decay "
         "or an adaptive (Adam) outer step would change the objective the inner step is "
         "tuned for (not defined by the paper)"
    for key in ("train.momentum", "train.weight-decay", "train.optimizer")
}


# ------------------------------------------------------------------------------ parameters
@dataclass(frozen=True)
class FedAvgFTParams(Params):
    """hyper.fedavg-ft."""

    finetune_steps: int = param(10, POS, "an integer >= 1",
                                "local SGD steps (mini-batches) of fine-tuning before evaluation")


@dataclass(frozen=True)
class FedProxParams(Params):
    """hyper.fedprox."""

    mu: float = param(1.0, POS, "a number > 0 (mu = 0 is FedAvg)",
                      "proximal weight; 1 is the value Li et al. 2020 report best for MNIST "
                      "(their grid {0.001, 0.01, 0.1, 1})")


@dataclass(frozen=True)
class FedProxFTParams(FedAvgFTParams, FedProxParams):
    """hyper.fedprox-ft: FedProx's mu, then FedAvg-FT's finetune-steps (the fields of the
    last base come first: mu, finetune-steps)."""

    mu: float = param(1.0, POS, "a number > 0 (mu = 0 is FedAvg-FT)",
                      "proximal weight, as fedprox")


@dataclass(frozen=True)
class ScaffoldParams(Params):
    """hyper.scaffold."""

    global_lr: float = param(1.0, POS, "a number > 0",
                             "global step size eta_g (1 in the paper's experiments: the server "
                             "takes the mean client model)")


@dataclass(frozen=True)
class APFLParams(Params):
    """hyper.apfl."""

    alpha_init: float = param(0.5, lambda v: 0 < v < 1,
                              "a number in (0, 1) (0 is FedAvg, 1 is Local)",
                              "initial mixing weight alpha_i (the middle of the paper's grid "
                              "{0.25, 0.5, 0.75})")
    adapt_alpha: bool = param(True, None, "true or false",
                              "update alpha_i by its gradient each local step (adaptive APFL)")
    alpha_lr: float = param(0.05, POS, "a number > 0",
                            "step size of the alpha update; the paper uses the model step size "
                            "eta (our train.lr default 0.05)")


@dataclass(frozen=True)
class DittoParams(Params):
    """hyper.ditto."""

    lambda_: float = param(0.1, POS, "a number > 0 (lambda = 0 is Local training)",
                           "personalization weight; the paper tunes it per data set from "
                           "{0.05, 0.1, 0.2, 0.5, 1, 2}; 0.1 from that grid")
    personal_steps: str | int = param(
        "auto", lambda v: v == "auto" or (not isinstance(v, str) and v >= 1),
        "an integer >= 1 or 'auto'",
        "SGD steps on v_i per round; 'auto' = the configured local steps/epochs (as the "
        "paper, s = local epochs of w)")


@dataclass(frozen=True)
class PerFedAvgParams(Params):
    """hyper.perfedavg."""

    variant: Literal["fo", "hf"] = param(
        "fo", in_(("fo", "hf")), "one of ['fo', 'hf']",
        "first-order (FO) or Hessian-free (HF) meta-gradient; FO is the one Self-FL and the "
        "pFedMe comparisons run")
    alpha: float = param(
        0.05, POS, "a number > 0 (alpha = 0 is FedAvg)",
        "inner (personalization) step size alpha; beta is train.lr. Not a paper value (Fallah "
        "et al. tune alpha, beta per task): 0.05 = the default train.lr, so the "
        "personalization step is one ordinary SGD step")
    delta: float = param(0.001, POS, "a number > 0",
                         "finite-difference step of the HF Hessian-vector product")
    personal_steps: int = param(1, POS, "an integer >= 1",
                                "SGD steps from the global model before personalized "
                                "evaluation (the paper: one step)")


# ------------------------------------------- messages (server -> client, client -> server)
@dataclass(frozen=True)
class FedProxFit(Wire):
    """FedProx: the prox weight mu of ``mu/2 ||w - w^t||^2``."""

    mu: float


@dataclass(frozen=True)
class FineTuneEval(Wire):
    """FedAvg-FT / FedProx-FT: local SGD steps on the global model before evaluation."""

    finetune_steps: int


@dataclass(frozen=True)
class DittoFit(Wire):
    """Ditto: lambda of the personal model's prox term, its local steps (0: the run's)."""

    lam: float = key("lambda")
    personal_steps: int = key("personal-steps")


@dataclass(frozen=True)
class PerFedAvgFit(Wire):
    """Per-FedAvg: the MAML variant ('fo' | 'hf'), inner step alpha, Hessian step delta."""

    variant: str
    alpha: float
    delta: float


@dataclass(frozen=True)
class PerFedAvgEval(Wire):
    """Per-FedAvg's personalization at evaluation: steps at rate alpha."""

    alpha: float
    personal_steps: int


@dataclass(frozen=True)
class APFLInstruction(Wire):
    """APFL (fit and evaluation): the mixing weight alpha's start, its rate, adapt or not."""

    alpha_init: float
    alpha_lr: float
    adapt_alpha: bool


#: newcomer rules (docs/newcomers.md): a held-out client that never trained
FINE_TUNE = Newcomer("the global model, fine-tuned for the budget (FedAvg-FT)", "derived")
SCRATCH = Newcomer("its own model trained from the initial model for the budget", "derived")
DITTO_NEWCOMER = Newcomer("v = argmin f_i(v) + lambda/2 dist(v, w*)^2 from v = w*, the "
                          "budget's SGD steps (Alg. 1's personal solve)", "paper")
APFL_NEWCOMER = Newcomer("v from w* and alpha from alpha-init, learned through the mixture "
                         "against the fixed global w* for the budget; alpha v + (1 - alpha) w* "
                         "evaluated", "derived")
PERFEDAVG_NEWCOMER = Newcomer("the global (meta) model after the budget's SGD steps of size "
                              "alpha (its few-step adaptation)", "paper")

#: Local's decision: nothing leaves a client
NOTHING = ("nothing leaves a Local client (no upload: ε = 0 without DP); there is nothing "
           "to protect")


FEDAVG = Entry(
    "fedavg",
    "FedAvg (McMahan et al. 2017): one global model, sample-weighted mean of client models.",
    privacy=Decision(WHOLE_MODEL, None, None),
    newcomer=FINE_TUNE,
)


LOCAL = Entry(
    "local",
    "Separate/Local training: every client trains only its own model; no weights exchanged.",
    privacy=Decision("nothing", NOTHING, NOTHING),
    newcomer=SCRATCH,
)


FEDAVG_FT = Entry(
    "fedavg-ft",
    "FedAvg + local fine-tuning: the global model fine-tuned for `finetune-steps` SGD steps "
    "on the client's data before personalized evaluation.",
    params=FedAvgFTParams,
    privacy=Decision(WHOLE_MODEL, None, None),
    wire=(FineTuneEval,),
    newcomer=FINE_TUNE,
)


FEDPROX = Entry(
    "fedprox",
    "FedProx (Li et al., MLSys 2020): FedAvg whose clients minimise "
    "F_i(w) + mu/2 ||w - w_global||^2.",
    params=FedProxParams,
    privacy=Decision(WHOLE_MODEL, None, None),
    wire=(FedProxFit,),
    newcomer=FINE_TUNE,
)


FEDPROX_FT = Entry(
    "fedprox-ft",
    "FedProx + local fine-tuning (FedAMP's baseline): FedProx training, then the global model "
    "fine-tuned for `finetune-steps` SGD steps before personalized evaluation.",
    params=FedProxFTParams,
    privacy=Decision(WHOLE_MODEL, None, None),
    wire=(FedProxFit, FineTuneEval),
    newcomer=FINE_TUNE,
)


SCAFFOLD = Entry(
    "scaffold",
    "SCAFFOLD (Karimireddy et al., ICML 2020): control variates c (server) and c_i (client) "
    "correct each local step by c - c_i; option II update of c_i; global step eta_g.",
    params=ScaffoldParams,
    refuses=refusals(SCAFFOLD_REFUSES),
    privacy=Decision("w_i and the control delta dc_i, clipped together", None, None),
    mechanism=Mechanism("SCAFFOLD", "its control variate c_i from an earlier round",
                        "c_i = 0: the correction is c alone"),
    newcomer=FINE_TUNE,
)


APFL = Entry(
    "apfl",
    "APFL (Deng et al. 2020): each client keeps v_i and alpha_i; its personalized model "
    "alpha_i v_i + (1 - alpha_i) w is trained as the mixture, alpha_i by its gradient.",
    params=APFLParams,
    refuses=refusals(APFL_REFUSES),
    privacy=Decision("the global-model copy w_i (v_i, alpha_i never leave)", None,
                     OWN_LOOP.format(what="APFL's joint w/v/alpha step")),
    mechanism=Mechanism("APFL", "v_i and the adapted alpha_i carried over from an earlier "
                        "round", "v_i = w and alpha_i = alpha-init; an untrained client "
                        "evaluates w"),
    wire=(APFLInstruction,),
    newcomer=APFL_NEWCOMER,
)


DITTO = Entry(
    "ditto",
    "Ditto (Li et al., ICML 2021): the global model trained as FedAvg; each client's personal "
    "v_i trained on f_i(v) + lambda/2 ||v - w_global||^2; P and G evaluated.",
    params=DittoParams,
    privacy=Decision("the global-model copy w_i (v_i never leaves)", None, None),
    mechanism=Mechanism("Ditto", "personal v_i carried over from an earlier round",
                        "v_i starts at the global model; an untrained client evaluates w"),
    wire=(DittoFit,),
    newcomer=DITTO_NEWCOMER,
)


PERFEDAVG = Entry(
    "perfedavg",
    "Per-FedAvg (Fallah et al., NeurIPS 2020): MAML meta-update with separate mini-batches; "
    "FO or HF variant; personalized = global + `personal-steps` SGD steps of size alpha on "
    "the client's training data.",
    params=PerFedAvgParams,
    refuses=refusals(PERFEDAVG_REFUSES),
    privacy=Decision(WHOLE_MODEL, None,
                     OWN_LOOP.format(what="Per-FedAvg's meta-gradient step")),
    wire=(PerFedAvgFit, PerFedAvgEval),
    newcomer=PERFEDAVG_NEWCOMER,
)

ENTRIES = [FEDAVG, LOCAL, FEDAVG_FT, FEDPROX, FEDPROX_FT, SCAFFOLD, APFL, DITTO, PERFEDAVG]
