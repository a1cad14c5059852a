"""FedBN (Li, Jiang, Zhang, Kamp & Dou, "FedBN: Federated Learning on Non-IID Features via
Local Batch Normalization", ICLR 2021): every BatchNorm layer stays on its client, the rest
is averaged (docs/algorithms/fedbn.md).

No hyper-parameter: which arrays stay local is the model's BatchNorm layers
(``algorithms.fedbn_math.batchnorm_indices``). A model without BatchNorm (mclr, dnn, cnn)
makes FedBN FedAvg; the server says so in a WARNING (only resnet18 of the built-ins has
BatchNorm).
"""

from __future__ import annotations

from flower_pfl.contract import Decision, Entry, Mechanism, Newcomer

#: sample-level DP: opacus has no per-sample gradient through BatchNorm
BATCHNORM_MIXES = ("FedBN's local BatchNorm layers mix the samples of a batch (each output "
                   "depends on the batch's mean and variance), so the per-sample gradients "
                   "DP-SGD clips do not exist; use mode: client-level")

FEDBN = Entry(
    "fedbn",
    "FedBN (Li et al., ICLR 2021, Alg. 1): BatchNorm layers (weights, biases, running "
    "statistics) stay local; every other layer is averaged (n_k / n).",
    privacy=Decision("every array but the BatchNorm layers' (those never leave)", None,
                     BATCHNORM_MIXES),
    mechanism=Mechanism("FedBN", "its own BatchNorm layers (weights, biases, running "
                        "statistics) carried over from an earlier round",
                        "the initial BatchNorm layers; an untrained client evaluates (global "
                        "layers, initial BatchNorm)"),
    newcomer=Newcomer("(the global layers, the initial BatchNorm layers) trained for the "
                      "budget, its BatchNorm statistics fitted to its own batches (FedBN's "
                      "local update)", "derived"),
)

ENTRIES = [FEDBN]
