"""FedPer (Arivazhagan, Aggarwal, Singh & Choudhary, "Federated Learning with
Personalization Layers", arXiv:1912.00818, 2019): a shared base and personal layers
(docs/algorithms/fedper.md).

The personal layers are the model's head (``learning.layers.head_split``: the built-ins'
last layer, a user model's declared head); FedPer itself varies their number K_P per
experiment. It has no hyper-parameter of its own: the split is the model's.
"""

from __future__ import annotations

from flower_pfl.catalog import HEAD
from flower_pfl.contract import Decision, Entry, Mechanism, Newcomer

FEDPER = Entry(
    "fedper",
    "FedPer (Arivazhagan et al. 2019): base layers shared and averaged (n_j / n), personal "
    "layers (the head) kept by each client; both trained jointly every round.",
    privacy=Decision("the base layers W_B,j (the personal layers never leave)", None, None),
    mechanism=Mechanism("FedPer", *HEAD),
    newcomer=Newcomer("(the global base, the initial head) trained jointly for the budget "
                      "(FedPer's local update)", "derived"),
)

ENTRIES = [FEDPER]
