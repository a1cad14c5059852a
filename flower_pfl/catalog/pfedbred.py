"""pFedBreD_ns (Shi et al., NeurIPS 2023) and pFedMe (Dinh et al., NeurIPS 2020).

Defaults: the pFedBreD paper's "Hyperparameter Settings" (section 6.1), which it uses for
every method including pFedMe.  ``pfedbred`` takes ``prior: lg | meg | mh``; the
convenience names ``pfedbred-lg``, ``pfedbred-meg``, ``pfedbred-mh`` fix the prior so a
benchmark matrix of strategy names covers the three meta-steps without hyper overrides.
The choices the paper leaves open, and the runs: docs/algorithms/pfedbred.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

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
from flower_pfl.instructions import Reply, Wire
from flower_pfl.instructions import key as wire_key

_PAPER = "pFedBreD section 6.1 'Hyperparameter Settings'"


def _theta_init(default: str) -> Any:
    return param(default, in_(("carry", "restart")), "one of ['carry', 'restart']",
                 f"theta's start each round: carry = theta_iR of the client's last round "
                 f"(pFedBreD's Algorithm 1 line 5), restart = the received w (Dinh et al.'s "
                 f"pFedMe); {default} here")


# The parameters.  A dataclass's fields are ordered from its last base to its first (the
# reverse of the MRO), then its own: FixedPriorParams(EnvelopeParams, MetaStepParams) holds
# the meta-step's keys, then the envelope's; PFedBreDParams puts 'prior' before both.
@dataclass(frozen=True)
class EnvelopeParams(Params):
    """The keys of the whole family (pFedMe's and pFedBreD's bi-level solver, section 6.1);
    pFedBreD's theta-init default (carry)."""

    lambda_: float = param(15.0, POS, "a number > 0",
                           f"lambda, prox / prior weight of eq. 12; 15 ({_PAPER}: chosen from "
                           f"15-60; 15 is the lower end)")
    alpha: float = param(0.01, POS, "a number > 0",
                         f"alpha, personal step of the K prox SGD steps (line 8); 0.01 "
                         f"({_PAPER})")
    alpha_m: float = param(0.01, POS, "a number > 0",
                           f"alpha_m, main-problem step of line 9; 0.01 ({_PAPER})")
    beta: float = param(1.0, POS,
                        "a number > 0 (beta = 0 would freeze the global model: w(t) = w(t-1); "
                        "beta > 1 extrapolates as pFedMe does)",
                        f"beta of line 12, w(t) = (1-beta) w(t-1) + beta mean_i w_iR; 1 "
                        f"({_PAPER})")
    local_iterations: int = param(20, POS, "an integer >= 1",
                                  f"R, local iterations per round, one mini-batch each; 20 "
                                  f"({_PAPER})")
    prox_steps: int = param(5, POS, "an integer >= 1",
                            f"K, SGD steps of the approximate prox mapping (line 8); 5 "
                            f"({_PAPER}: 'number of proximal iterations')")
    batch_size: int = param(20, POS, "an integer >= 1",
                            f"mini-batch size of each local iteration; 20 ({_PAPER}, "
                            f"non-Sent140). train.batch-size/lr/epochs/steps are refused for "
                            f"this family (docs/training.md)")
    theta_init: Literal["carry", "restart"] = _theta_init("carry")
    weighting: Literal["uniform", "samples"] = param(
        "uniform", in_(("uniform", "samples")), "one of ['uniform', 'samples']",
        "E_I of line 12: uniform mean over the sampled clients (the paper's uniform sampling) "
        "or the sample-weighted mean")


@dataclass(frozen=True)
class PFedMeParams(EnvelopeParams):
    """hyper.pfedme: the family's keys, theta restarting at w each round (Dinh et al.)."""

    theta_init: Literal["carry", "restart"] = _theta_init("restart")


@dataclass(frozen=True)
class MetaStepParams(Params):
    """The meta-step's keys (eq. 14) and line 9's envelope gradient."""

    eta: float = param(0.05, lambda v: v >= 0, "a number >= 0",
                       f"eta, meta-step size of the memorized envelope gradient in eq. 14 (meg, "
                       f"mh); 0.05 ({_PAPER}). 0 switches meg off (= pFedMe; warned)")
    eta_alpha: float = param(0.01, lambda v: v >= 0, "a number >= 0",
                             f"eta_alpha, meta-step size of the loss gradient in eq. 14 (lg, "
                             f"mh); 0.01 ({_PAPER}). 0 switches lg off (= pFedMe; warned)")
    envelope: Literal["mu", "w"] = param(
        "mu", in_(("mu", "w")), "one of ['mu', 'w']",
        "line 9's envelope gradient: lambda (mu - theta), eq. 13 as printed and as the "
        "authors' code, or lambda (w - theta), pFedMe's form")


@dataclass(frozen=True)
class FixedPriorParams(EnvelopeParams, MetaStepParams):
    """hyper.pfedbred-<prior> (lg, meg, mh, mh-lookahead): the meta-step's keys, then the
    family's."""


@dataclass(frozen=True)
class PriorParams(Params):
    """The prior pfedbred chooses by its hyper-parameter."""

    prior: Literal["lg", "meg", "mh", "mh-lookahead"] = param(
        "mh", in_(("lg", "meg", "mh", "mh-lookahead")),
        "one of ['lg', 'meg', 'mh', 'mh-lookahead']",
        "meta-step of eq. 14: loss gradient, memorized envelope gradient, or memorized hybrid "
        "(both); mh is the paper's main method (Table 1); mh-lookahead: the authors' code's "
        "mh (a look-ahead gradient on a second batch applied to w, then the meg term)")


@dataclass(frozen=True)
class PFedBreDParams(FixedPriorParams, PriorParams):
    """hyper.pfedbred: 'prior', then the keys of a fixed prior's entry."""


_SOLVER = ("pFedBreD / pFedMe (Alg. 1 lines 6-10) run their own bi-level solver: K plain SGD "
           "steps of size alpha on f_i(theta) + lambda/2 ||theta - mu||^2, then w -= alpha_m "
           "lambda (mu - theta) (eq. 13); the step sizes are hyper-parameters, the prox "
           "problem's solution is what the envelope gradient needs, and the paper defines no "
           "momentum buffer, decay term or adaptive (Adam) step in either step")


def refuses(name: str) -> dict[str, str]:
    """The train keys entry ``name`` refuses: the family's local solver is the paper's, on its
    own hyper-parameters (``hyper.<name>.*``, section 6.1), which the reasons name."""
    hyper = f"hyper.{name}"
    iterations = (f"pFedBreD / pFedMe (Alg. 1 lines 6-8) run, per round, {hyper}.local-iterations "
                  f"(R) local iterations of one mini-batch each, with {hyper}.prox-steps (K) "
                  f"prox steps per iteration (section 6.1)")
    return refusals({
        "train.epochs": f"{iterations}, not epochs: train.epochs has no role",
        "train.steps": f"{iterations}: train.steps has no role",
        "train.batch-size": f"each local iteration of pFedBreD / pFedMe (Alg. 1 line 7) draws "
                            f"one mini-batch of {hyper}.batch-size samples (section 6.1): "
                            f"train.batch-size has no role",
        "train.lr": f"pFedBreD / pFedMe's solver takes its step sizes from {hyper}.alpha (the "
                    f"K prox steps, Alg. 1 line 8) and {hyper}.alpha-m (the step on w, line 9, "
                    f"eq. 13), constant hyper-parameters (section 6.1): train.lr has no role",
        **{key: _SOLVER for key in ("train.momentum", "train.weight-decay", "train.optimizer")},
        "train.lr-schedule": f"pFedBreD / pFedMe (Alg. 1) take constant step sizes alpha and "
                             f"alpha_m ({hyper}.alpha, {hyper}.alpha-m; section 6.1), not "
                             f"train.lr, whose schedule this key sets",
    })


def _stability(values: Mapping[str, Any], hyper: Mapping[str, Any]) -> list[str]:
    """Explicit SGD on lambda/2||theta - mu||^2 (step alpha) and line 9 (step alpha_m) multiply
    the gap by (1 - step*lambda): at step*lambda >= 1 they overshoot (>= 2: diverge)."""
    problems = []
    lam = hyper.get("lambda")  # validated: present
    for key in ("alpha", "alpha-m"):
        product = hyper[key] * lam
        if product >= 1.0:
            problems.append(f"'{key}' * 'lambda' = {product:.3g} >= 1: the step overshoots "
                            f"the prox centre (gap multiplied by 1 - {key}*lambda); lower {key} "
                            f"or lambda")
    return problems


# What the family shares; each entry's summary starts with what tells it apart (the
# one-line listing of `flower-pfl strategies` is cut at the terminal's width).
_SUMMARY = ("pFedBreD_ns (Shi et al., NeurIPS 2023, Alg. 1, spherical Gaussian prior): per local "
            "iteration mu = meta-step (eq. 14), theta = K-step prox of f_i around mu, "
            "w -= alpha_m lambda (mu - theta) (eq. 13, hyper 'envelope': mu - theta or "
            "w - theta); server w = (1-beta) w + beta mean w_i.")
_PRIORS = {
    "lg": "prior lg: mu = w - eta_alpha grad f_i(w) (loss gradient)",
    "meg": "prior meg: mu = w - eta (w_iR(t-1) - theta) (memorized envelope gradient)",
    "mh": "prior mh: mu = w - eta_alpha grad f_i(w) - eta (w_iR(t-1) - theta) (both; the "
          "paper's main method)",
    "mh-lookahead": "prior mh-lookahead: a look-ahead gradient on a 2nd batch applied to w, "
                    "then meg's mu (the authors' code's mh)",
}


# ------------------------------------------- messages (server -> client, client -> server)
@dataclass(frozen=True)
class PFedBreDFit(Wire):
    """pFedBreD / pFedMe (Shi et al., Alg. 1): the client's inner problem and meta-step."""

    lam: float = wire_key("lambda")
    alpha: float = wire_key("alpha")
    alpha_m: float = wire_key("alpha-m")
    local_iterations: int = wire_key("local-iterations")
    prox_steps: int = wire_key("prox-steps")
    batch_size: int = wire_key("batch-size")
    theta_init: str = wire_key("theta-init")  # 'carry' | 'restart'
    prior: str = wire_key("prior")  # 'none' (pFedMe) | 'lg' | 'meg' | 'mh' | 'mh-lookahead'
    eta: float = wire_key("eta")
    envelope: str = wire_key("envelope")
    eta_alpha: float = wire_key("eta-alpha")


@dataclass(frozen=True)
class PFedBreDReply(Reply):
    """pFedBreD's fit metric the server averages (server.csv: mean_w_theta_gap)."""

    w_theta_gap: float | None = None  # ||w_i - theta_i|| (always sent; report only)


#: every variant's DP decision: the whole model leaves; the client's own inner loop
ENVELOPE = Decision(WHOLE_MODEL, None, OWN_LOOP.format(what="the Moreau-envelope inner loop"))

#: every pFedBreD variant's mechanism (pFedMe, theta-init restart, has none: nothing of an
#: earlier round enters a fit)
CARRIED = Mechanism(
    "pFedBreD", "theta_i (theta-init: carry) and, for meg/mh, the memorized w_i carried "
    "over from an earlier round", "both start at the received w")

PFEDBRED = Entry(
    "pfedbred",
    "prior chosen by hyper 'prior' (lg | meg | mh | mh-lookahead; default mh). " + _SUMMARY,
    params=PFedBreDParams,
    cross_check=_stability, refuses=refuses("pfedbred"),
    privacy=ENVELOPE,
    mechanism=CARRIED,
    wire=(PFedBreDFit, PFedBreDReply),
)


def _fixed_prior(prior: str) -> Entry:
    """``pfedbred-<prior>``: pFedBreD with its prior fixed (no 'prior' hyper-parameter)."""
    return Entry(f"pfedbred-{prior}", f"{_PRIORS[prior]}. " + _SUMMARY,
                 params=FixedPriorParams,
                 cross_check=_stability, refuses=refuses(f"pfedbred-{prior}"),
                 privacy=ENVELOPE, mechanism=CARRIED, wire=(PFedBreDFit, PFedBreDReply))


PFEDBRED_LG = _fixed_prior("lg")
PFEDBRED_MEG = _fixed_prior("meg")
PFEDBRED_MH = _fixed_prior("mh")
PFEDBRED_MH_LOOKAHEAD = _fixed_prior("mh-lookahead")
PFEDME = Entry(
    "pfedme",
    "pFedMe (Dinh et al., NeurIPS 2020): no prior, mu = w (Moreau envelope, no "
    "meta-step; pFedBreD's 'Non-PP' row), theta restarts at w each round.",
    params=PFedMeParams,
    cross_check=_stability, refuses=refuses("pfedme"),
    privacy=ENVELOPE,
    wire=(PFedBreDFit, PFedBreDReply),
    newcomer=Newcomer("theta from the global w, the budget's SGD steps of size alpha on the "
                      "inner problem f_i(theta) + lambda/2 dist(theta, w)^2", "paper"),
)

ENTRIES = [PFEDBRED, PFEDBRED_LG, PFEDBRED_MEG, PFEDBRED_MH, PFEDBRED_MH_LOOKAHEAD, PFEDME]
