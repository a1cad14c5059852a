"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov & Morency, "Think
Locally, Act Globally: Federated Learning with Local and Global Representations", 2020):
local representations, a shared global head -- FedPer's mirror (docs/algorithms/
lgfedavg.md).

The global layers are the model's head (``learning.layers.head_split``), the local
representation every other layer. No hyper-parameter of its own: the split is the model's.
"""

from __future__ import annotations

from flower_pfl.contract import Decision, Entry, Mechanism, Newcomer

LG_FEDAVG = Entry(
    "lg-fedavg",
    "LG-FedAvg (Liang et al. 2020): each client keeps its local representation (the body); "
    "the global head is averaged (n_m / n) over the round's clients; both trained jointly.",
    privacy=Decision("the global head (the local representation never leaves)", None, None),
    mechanism=Mechanism("LG-FedAvg", "its own local representation (body) carried over from "
                        "an earlier round", "the initial body; an untrained client evaluates "
                        "(initial body, global head)"),
    newcomer=Newcomer("(its initial body, the global head) trained jointly for the budget "
                      "(LG-FedAvg's local update)", "derived"),
)

ENTRIES = [LG_FEDAVG]
