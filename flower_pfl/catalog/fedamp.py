"""FedAMP and HeurFedAMP (Huang et al., AAAI 2021).

Each default is the paper's where it gives one; the others are our choices, explained in
words here and measured in docs/algorithms/fedamp.md (the section each ``doc`` names).
"""

from __future__ import annotations

from flower_pfl.hyper import NUM, POS, Entry, Hyper, auto_or_positive

# which model a client scores (both FedAMP variants; strategies/message_passing.py)
EVALUATE = Hyper("cloud", (str,), lambda v: v in ("personal", "cloud"),
                 "one of ['personal', 'cloud']",
                 "the model each client evaluates: 'cloud' = the personalized cloud model u_i "
                 "the server would send next; 'personal' = w_i, one local epoch past u_i (the "
                 "paper does not say which it scores). Default cloud: u_i averages out the SGD "
                 "noise of w_i's last local epoch, which costs the worst clients most "
                 "(docs/algorithms/fedamp.md, 'Which model is scored')")

FEDAMP = Entry(
    "fedamp",
    "FedAMP (Huang et al., AAAI 2021): attentive message passing, eq. 5 weights "
    "xi_ij = alpha_k A'(||w_i-w_j||^2), A(x)=1-exp(-x/sigma); client solves eq. 6.",
    {
        "alpha-k": auto_or_positive(
            "step size alpha_k of eq. 3/5; 'auto' = the largest alpha_k that keeps every "
            "xi_ii >= min-self-weight for this round's distances"),
        "min-self-weight": Hyper(0.5, NUM, lambda v: 0 <= v < 1, "a number in [0, 1)",
                                 "smallest self weight xi_ii alpha-k: auto allows (the "
                                 "closest client puts 1 - this on its peers); 0.5 = "
                                 "HeurFedAMP's xi_ii, so both variants keep half of the "
                                 "cloud model the client's own (docs/algorithms/"
                                 "fedamp.md, 'FedAMP')"),
        "alpha-schedule": Hyper("constant", (str,),
                                lambda v: v in ("constant", "inverse-sqrt", "inverse"),
                                "one of ['constant', 'inverse-sqrt', 'inverse']",
                                "alpha_k = alpha_1 * {1, 1/sqrt(k), 1/k} (Theorems 1-2)"),
        "lambda": auto_or_positive(
            "lambda of eq. 1/6; the client's prox weight is lambda/alpha_k. 'auto' = "
            "prox-weight * alpha_k, i.e. a fixed prox weight"),
        "prox-weight": Hyper(0.1, NUM, POS, "a number > 0",
                             "lambda/alpha_k when lambda is auto: the pull of the client's "
                             "local problem toward u_i (SGD needs lr * weight < 1). A weight "
                             "near 1/lr keeps w_i within a few SGD steps of u_i (in round 1: "
                             "of the random initial model), so a client cannot learn its "
                             "own data; 0.1 lets it move away (docs/algorithms/fedamp.md, "
                             "'Round-1 handicap and the collapses: the prox weight')"),
        "sigma": auto_or_positive(
            "sigma of A(x)=1-exp(-x/sigma); 'auto' = sigma-scale * the median squared "
            "distance between the stored client models, recomputed each round"),
        "evaluate": EVALUATE,
        "sigma-scale": Hyper(0.2, NUM, POS, "a number > 0",
                             "sigma = sigma-scale * median squared distance when sigma is "
                             "auto; smaller = sharper attention on the closest peers. The "
                             "median itself (1) gives nearly flat attention; 0.2 puts most "
                             "of the peer weight on related clients and still leaves each "
                             "client a share from its peers, where much smaller leaves some "
                             "alone (docs/algorithms/fedamp.md, 'Flat attention of sigma: "
                             "auto')"),
    },
)


HEURFEDAMP = Entry(
    "heurfedamp",
    "HeurFedAMP (Huang et al., AAAI 2021, eq. 8): softmax of sigma*cos(w_i, w_j) over j != i, "
    "scaled by 1 - xi_ii.",
    {
        "alpha-k": Hyper(1.0, NUM, POS, "a number > 0",
                         "alpha_k of eq. 6: the client's prox weight is lambda/alpha_k"),
        "lambda": Hyper(0.1, NUM, POS, "a number > 0",
                        "lambda of eq. 6: with alpha-k 1 the client's prox weight "
                        "lambda/alpha_k = 0.1, FedAMP's prox-weight default, for the same "
                        "reason (docs/algorithms/fedamp.md, 'Round-1 handicap and the "
                        "collapses: the prox weight')"),
        "sigma": Hyper(1000.0, NUM, POS, "a number > 0",
                       "softmax scale of eq. 8. Cosines of models grown from one "
                       "initialisation are all close to 1, so sigma must be large for the "
                       "softmax to separate them: 1000 puts the attention inside the "
                       "client's group where 100 leaves it near uniform "
                       "(docs/algorithms/fedamp.md, 'HeurFedAMP')"),
        "evaluate": EVALUATE,
        "self-weight": Hyper(0.5, NUM, lambda v: 0 <= v < 1, "a number in [0, 1)",
                             "xi_ii of eq. 8: the weight of the client's own model"),
    },
)

ENTRIES = [FEDAMP, HEURFEDAMP]
