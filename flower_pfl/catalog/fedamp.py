"""FedAMP and HeurFedAMP (Huang et al., AAAI 2021)."""

from __future__ import annotations

from flower_pfl.hyper import NUM, POS, Entry, Hyper, auto_or_positive

# which model a client scores (both FedAMP variants; strategies/message_passing.py)
EVALUATE = Hyper("cloud", (str,), lambda v: v in ("personal", "cloud"),
                 "one of ['personal', 'cloud']",
                 "the model each client evaluates: 'cloud' = the personalized cloud model u_i "
                 "the server would send next (averages out w_i's last-epoch SGD noise: practical "
                 "30 clients, 60 rounds, worst-10% 87.35/87.56 vs 82.30/82.44 scoring w_i); "
                 "'personal' = w_i (the paper's personalized model, one local epoch past u_i); "
                 "docs/algorithms/fedamp.md, issue 13")

ENTRIES = [
    Entry(
        "fedamp", "strategies.fedamp:FedAMP", "clients.fedamp:FedAMPClient",
        "FedAMP (Huang et al., AAAI 2021): attentive message passing, eq. 5 weights "
        "xi_ij = alpha_k A'(||w_i-w_j||^2), A(x)=1-exp(-x/sigma); client solves eq. 6.",
        {
            "alpha-k": auto_or_positive(
                "step size alpha_k of eq. 3/5; 'auto' = the largest alpha_k that keeps every "
                "xi_ii >= min-self-weight for this round's distances"),
            "min-self-weight": Hyper(0.5, NUM, lambda v: 0 <= v < 1, "a number in [0, 1)",
                                     "smallest self weight xi_ii alpha-k: auto allows (the "
                                     "closest client puts 1 - this on its peers); 0.5 = "
                                     "HeurFedAMP's xi_ii, docs/algorithms/fedamp.md"),
            "alpha-schedule": Hyper("constant", (str,),
                                    lambda v: v in ("constant", "inverse-sqrt", "inverse"),
                                    "one of ['constant', 'inverse-sqrt', 'inverse']",
                                    "alpha_k = alpha_1 * {1, 1/sqrt(k), 1/k} (Theorems 1-2)"),
            "lambda": auto_or_positive(
                "lambda of eq. 1/6; the client's prox weight is lambda/alpha_k. 'auto' = "
                "prox-weight * alpha_k, i.e. a fixed prox weight"),
            "prox-weight": Hyper(0.1, NUM, POS, "a number > 0",
                                 "lambda/alpha_k when lambda is auto (SGD needs lr * weight < 1). "
                                 "1 held every client within ~1/(lr*1) = 20 SGD steps of u_i "
                                 "(round 1: of the random init) and lost to Local; 0.1 measured "
                                 "in docs/algorithms/fedamp.md"),
            "sigma": auto_or_positive(
                "sigma of A(x)=1-exp(-x/sigma); 'auto' = sigma-scale * the median squared "
                "distance between the stored client models, recomputed each round"),
            "evaluate": EVALUATE,
            "sigma-scale": Hyper(0.2, NUM, POS, "a number > 0",
                                 "sigma = sigma-scale * median squared distance when sigma is "
                                 "auto; 1 gave nearly flat attention (pathological split: 0.41 "
                                 "of the peer weight on class-sharing peers, 0.92 at 0.2; "
                                 "docs/algorithms/fedamp.md)"),
        },
    ),
    Entry(
        "heurfedamp", "strategies.heurfedamp:HeurFedAMP", "clients.fedamp:FedAMPClient",
        "HeurFedAMP (Huang et al., AAAI 2021, eq. 8): softmax of sigma*cos(w_i, w_j) over j != i, "
        "scaled by 1 - xi_ii.",
        {
            "alpha-k": Hyper(1.0, NUM, POS, "a number > 0",
                             "alpha_k of eq. 6: the client's prox weight is lambda/alpha_k"),
            "lambda": Hyper(0.1, NUM, POS, "a number > 0",
                            "lambda of eq. 6 (prox weight lambda/alpha_k = 0.1). 1 held each "
                            "client within ~20 SGD steps of u_i and lost to Local on the "
                            "practical partition; docs/algorithms/fedamp.md"),
            "sigma": Hyper(1000.0, NUM, POS, "a number > 0",
                           "softmax scale of eq. 8. Cosines of models that share an init are all "
                           "close to 1 (FMNIST CNN: spread ~1e-3), so sigma must be large to "
                           "separate them: measured in-group attention share on the practical "
                           "partition 0.32 at sigma=100 (uniform: 0.27), 1.0 at sigma=1000"),
            "evaluate": EVALUATE,
            "self-weight": Hyper(0.5, NUM, lambda v: 0 <= v < 1, "a number in [0, 1)",
                                 "xi_ii of eq. 8: the weight of the client's own model"),
        },
    ),
]
