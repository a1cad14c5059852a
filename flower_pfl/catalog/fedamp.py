"""FedAMP and HeurFedAMP (Huang et al., "Personalized Cross-Silo Federated Learning on
Non-IID Data", AAAI 2021): the contract.

Server (eq. 5/7):  u_i = xi_ii w_i + sum_{j != i} xi_ij w_j, xi_ij = alpha_k A'(||w_i - w_j||^2),
                   A(x) = 1 - exp(-x / sigma);  HeurFedAMP (eq. 8): xi_ij = softmax_{j != i}
                   (sigma cos(w_i, w_j)) (1 - xi_ii).
Client (eq. 6):    w_i = argmin_w F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2.

Each default is the paper's where it gives one; the others are our choices, explained in
words here and measured in docs/algorithms/fedamp.md (the section each ``doc`` names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flower_pfl.catalog import CLOUD
from flower_pfl.contract import (
    PER_UPLOAD,
    POS,
    WHOLE_MODEL,
    Decision,
    Entry,
    Mechanism,
    Params,
    auto_or_positive,
    in_,
    param,
)
from flower_pfl.instructions import Wire

EVALUATE_DOC = ("the model each client evaluates: 'cloud' = the personalized cloud model u_i "
                "the server would send next; 'personal' = w_i, one local epoch past u_i (the "
                "paper does not say which it scores). Default cloud: u_i averages out the SGD "
                "noise of w_i's last local epoch, which costs the worst clients most "
                "(docs/algorithms/fedamp.md, 'Which model is scored')")
EVALUATE_ALLOWED = "one of ['personal', 'cloud']"
SELF_WEIGHT = lambda v: 0 <= v < 1  # noqa: E731 - a one-line range check


@dataclass(frozen=True)
class FedAMPParams(Params):
    """hyper.fedamp."""

    alpha_k: str | float = auto_or_positive(
        "step size alpha_k of eq. 3/5; 'auto' = the largest alpha_k that keeps every "
        "xi_ii >= min-self-weight for this round's distances")
    min_self_weight: float = param(
        0.5, SELF_WEIGHT, "a number in [0, 1)",
        "smallest self weight xi_ii alpha-k: auto allows (the closest client puts 1 - this "
        "on its peers); 0.5 = HeurFedAMP's xi_ii, so both variants keep half of the cloud "
        "model the client's own (docs/algorithms/fedamp.md, 'FedAMP')")
    alpha_schedule: Literal["constant", "inverse-sqrt", "inverse"] = param(
        "constant", in_(("constant", "inverse-sqrt", "inverse")),
        "one of ['constant', 'inverse-sqrt', 'inverse']",
        "alpha_k = alpha_1 * {1, 1/sqrt(k), 1/k} (Theorems 1-2)")
    lambda_: str | float = auto_or_positive(
        "lambda of eq. 1/6; the client's prox weight is lambda/alpha_k. 'auto' = "
        "prox-weight * alpha_k, i.e. a fixed prox weight")
    prox_weight: float = param(
        0.1, POS, "a number > 0",
        "lambda/alpha_k when lambda is auto: the pull of the client's local problem toward "
        "u_i (SGD needs lr * weight < 1). A weight near 1/lr keeps w_i within a few SGD "
        "steps of u_i (in round 1: of the random initial model), so a client cannot learn "
        "its own data; 0.1 lets it move away (docs/algorithms/fedamp.md, 'Round-1 handicap "
        "and the collapses: the prox weight')")
    sigma: str | float = auto_or_positive(
        "sigma of A(x)=1-exp(-x/sigma); 'auto' = sigma-scale * the median squared distance "
        "between the stored client models, recomputed each round")
    evaluate: Literal["personal", "cloud"] = param(
        "cloud", in_(("personal", "cloud")), EVALUATE_ALLOWED, EVALUATE_DOC)
    sigma_scale: float = param(
        0.2, POS, "a number > 0",
        "sigma = sigma-scale * median squared distance when sigma is auto; smaller = "
        "sharper attention on the closest peers. The median itself (1) gives nearly flat "
        "attention; 0.2 puts most of the peer weight on related clients and still leaves "
        "each client a share from its peers, where much smaller leaves some alone "
        "(docs/algorithms/fedamp.md, 'Flat attention of sigma: auto')")


@dataclass(frozen=True)
class HeurFedAMPParams(Params):
    """hyper.heurfedamp."""

    alpha_k: float = param(1.0, POS, "a number > 0",
                           "alpha_k of eq. 6: the client's prox weight is lambda/alpha_k")
    lambda_: float = param(
        0.1, POS, "a number > 0",
        "lambda of eq. 6: with alpha-k 1 the client's prox weight lambda/alpha_k = 0.1, "
        "FedAMP's prox-weight default, for the same reason (docs/algorithms/fedamp.md, "
        "'Round-1 handicap and the collapses: the prox weight')")
    sigma: float = param(
        1000.0, POS, "a number > 0",
        "softmax scale of eq. 8. Cosines of models grown from one initialisation are all "
        "close to 1, so sigma must be large for the softmax to separate them: 1000 puts the "
        "attention inside the client's group where 100 leaves it near uniform "
        "(docs/algorithms/fedamp.md, 'HeurFedAMP')")
    evaluate: Literal["personal", "cloud"] = param(
        "cloud", in_(("personal", "cloud")), EVALUATE_ALLOWED, EVALUATE_DOC)
    self_weight: float = param(0.5, SELF_WEIGHT, "a number in [0, 1)",
                               "xi_ii of eq. 8: the weight of the client's own model")


@dataclass(frozen=True)
class FedAMPFit(Wire):
    """Server -> client, each fit (eq. 6): the prox weight lambda / alpha_k of the client's
    ``lambda/(2 alpha_k) ||w - u_i||^2`` (u_i: the arrays sent)."""

    prox_coef: float


FEDAMP = Entry(
    "fedamp",
    "FedAMP (Huang et al., AAAI 2021): attentive message passing, eq. 5 weights "
    "xi_ij = alpha_k A'(||w_i-w_j||^2), A(x)=1-exp(-x/sigma); client solves eq. 6.",
    params=FedAMPParams,
    privacy=Decision(WHOLE_MODEL, PER_UPLOAD.format(
        what="each w_j enters u_i with its own attention weight"), None),
    mechanism=Mechanism("FedAMP", *CLOUD),
    wire=(FedAMPFit,),
)


HEURFEDAMP = Entry(
    "heurfedamp",
    "HeurFedAMP (Huang et al., AAAI 2021, eq. 8): softmax of sigma*cos(w_i, w_j) over j != i, "
    "scaled by 1 - xi_ii.",
    params=HeurFedAMPParams,
    privacy=Decision(WHOLE_MODEL, PER_UPLOAD.format(
        what="each w_j enters u_i with its own cosine-softmax weight"), None),
    mechanism=Mechanism("HeurFedAMP", *CLOUD),
    wire=(FedAMPFit,),
)

ENTRIES = [FEDAMP, HEURFEDAMP]
