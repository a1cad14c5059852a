"""FedRoD (Chen & Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022): a shared body with a generic head trained with the
balanced-softmax loss, and a personal head per client (docs/algorithms/fedrod.md).

FedRoD's own knobs are the losses, not numbers: it has no hyper-parameter of its own (the
local training is the run's ``train.*``).
"""

from __future__ import annotations

from typing import Any, Mapping

from flower_pfl.contract import WHOLE_MODEL, Decision, Entry, Mechanism, Newcomer

#: why sample-level DP is refused
TWO_HEADS = (
    "its clients train the uploaded body and generic head in one step with the personal "
    "head, which runs through a functional call of the model on the detached body "
    "(torch.func): DP-SGD's per-sample gradients (opacus) do not cover that step; use "
    "mode: client-level")


def classes_only(values: Mapping[str, Any], hyper: Mapping[str, Any]) -> list[str]:
    """FedRoD's losses need class labels: the regression task is refused."""
    if values.get("data.dataset") == "synthetic-gaussian":
        return ["strategy 'fedrod' needs a classification task: its balanced-softmax loss "
                "reads the client's class counts (data.dataset synthetic-gaussian has none)"]
    return []


FEDROD = Entry(
    "fedrod",
    "FedRoD (Chen & Chao, ICLR 2022): body + generic head trained with the balanced-softmax "
    "loss and averaged as FedAvg; a personal head per client, trained with cross-entropy on "
    "the detached body's features; personalized logits = generic + personal.",
    privacy=Decision(WHOLE_MODEL + ": the body and the generic head (the personal head "
                     "never leaves)", None, TWO_HEADS),
    mechanism=Mechanism("FedRoD", "its personal head phi_i carried over from an earlier round",
                        "phi_i at its start (output layer zero): the generic model"),
    newcomer=Newcomer("the generic model (body and balanced-softmax head): its personal head "
                      "starts with a zero output layer, so it adds nothing (the paper's "
                      "generic model serves new clients)", "paper"),
    cross_check=classes_only,
)

ENTRIES = [FEDROD]
