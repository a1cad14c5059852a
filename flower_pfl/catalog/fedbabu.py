"""FedBABU (Oh, Kim & Yun, "FedBABU: Towards Enhanced Representation for Federated Image
Classification", ICLR 2022): the head stays at its random initialisation during federated
training, the body is averaged; personalization fine-tunes the whole model locally
(docs/algorithms/fedbabu.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.contract import POS, Decision, Entry, Newcomer, Params, param
from flower_pfl.instructions import Wire


@dataclass(frozen=True)
class FedBABUParams(Params):
    """hyper.fedbabu."""

    finetune_epochs: int = param(
        5, POS, "an integer >= 1",
        "tau: passes over the client's training data that fine-tune the whole model before "
        "personalized evaluation (the paper's experiments: tau = 5); not kept, the next "
        "round starts from the global model")


@dataclass(frozen=True)
class FedBABUEval(Wire):
    """FedBABU's personalization at evaluation: tau epochs of fine-tuning."""

    finetune_epochs: int


FEDBABU = Entry(
    "fedbabu",
    "FedBABU (Oh et al., ICLR 2022, Alg. 1): the head frozen at the server's random "
    "initialisation, the body trained and averaged (n_k / n); personalized = the global "
    "model fine-tuned for `finetune-epochs` epochs on the client's data.",
    params=FedBABUParams,
    privacy=Decision("the whole model w_i (its head is the one sent, unchanged: a zero delta)",
                     None, None),
    newcomer=Newcomer("the global model fine-tuned whole for the budget (its "
                      "personalization, the budget in place of tau epochs)", "paper"),
    wire=(FedBABUEval,),
)

ENTRIES = [FEDBABU]
