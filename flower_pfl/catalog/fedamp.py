"""FedAMP and HeurFedAMP (Huang et al., AAAI 2021)."""

from __future__ import annotations

from flower_pfl.hyper import NUM, POS, Entry, Hyper, auto_or_positive

ENTRIES = [
    Entry(
        "fedamp", "strategies.fedamp:FedAMP", "clients.fedamp:FedAMPClient",
        "FedAMP (Huang et al., AAAI 2021): attentive message passing, eq. 5 weights "
        "xi_ij = alpha_k A'(||w_i-w_j||^2), A(x)=1-exp(-x/sigma); client solves eq. 6.",
        {
            "alpha-k": auto_or_positive(
                "step size alpha_k of eq. 3/5; 'auto' = alpha-scale * sigma/(n_seen-1), the "
                "largest value that keeps every xi_ii >= 0"),
            "alpha-scale": Hyper(1.0, NUM, lambda v: 0 < v <= 1, "a number in (0, 1]",
                                 "fraction of the non-negativity bound used when alpha-k is auto"),
            "alpha-schedule": Hyper("constant", (str,),
                                    lambda v: v in ("constant", "inverse-sqrt", "inverse"),
                                    "one of ['constant', 'inverse-sqrt', 'inverse']",
                                    "alpha_k = alpha_1 * {1, 1/sqrt(k), 1/k} (Theorems 1-2)"),
            "lambda": auto_or_positive(
                "lambda of eq. 1/6; the client's prox weight is lambda/alpha_k. 'auto' = "
                "prox-weight * alpha_k, i.e. a fixed prox weight"),
            "prox-weight": Hyper(1.0, NUM, POS, "a number > 0",
                                 "lambda/alpha_k when lambda is auto (SGD needs lr * weight < 1)"),
            "sigma": auto_or_positive(
                "sigma of A(x)=1-exp(-x/sigma); 'auto' = median squared distance between the "
                "stored client models, recomputed each round"),
        },
    ),
    Entry(
        "heurfedamp", "strategies.heurfedamp:HeurFedAMP", "clients.fedamp:FedAMPClient",
        "HeurFedAMP (Huang et al., AAAI 2021, eq. 8): softmax of sigma*cos(w_i, w_j) over j != i, "
        "scaled by 1 - xi_ii.",
        {
            "alpha-k": Hyper(1.0, NUM, POS, "a number > 0",
                             "alpha_k of eq. 6: the client's prox weight is lambda/alpha_k"),
            "lambda": Hyper(1.0, NUM, POS, "a number > 0", "lambda of eq. 6"),
            "sigma": Hyper(1000.0, NUM, POS, "a number > 0",
                           "softmax scale of eq. 8. Cosines of models that share an init are all "
                           "close to 1 (FMNIST CNN: spread ~1e-3), so sigma must be large to "
                           "separate them: measured in-group attention share on the practical "
                           "partition 0.32 at sigma=100 (uniform: 0.27), 1.0 at sigma=1000"),
            "self-weight": Hyper(0.5, NUM, lambda v: 0 <= v < 1, "a number in [0, 1)",
                                 "xi_ii of eq. 8: the weight of the client's own model"),
        },
    ),
]
