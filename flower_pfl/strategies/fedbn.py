"""FedBN (Li et al., ICLR 2021) server: FedPer's server (strategies/fedper.py) whose
clients keep their BatchNorm layers.

Algorithm 1's aggregation: every layer that is not BatchNorm is averaged over the round's
clients, w <- sum_k (n_k / n) w_k; the BatchNorm layers' weights, biases and running
statistics never reach the server (``algorithms.fedbn_math.batchnorm_indices``,
clients/fedbn.py). Open in the paper: its experiments give every client the same number of
samples, so its mean is 1/K per client; with clients of different sizes this takes FedAvg's
n_k / n, which is 1/K there. A model without BatchNorm (mclr, dnn, cnn) makes FedBN FedAvg
without a global evaluation: a WARNING says so at the start.
"""

from __future__ import annotations

from typing import Any

from flower_pfl.catalog import fedbn as catalog
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.fedper import SharedPart


@strategy_for(catalog.FEDBN)
class FedBN(SharedPart):
    """Every non-BatchNorm array averaged; BatchNorm layers never leave a client."""

    personal_part = "BatchNorm layer (FedBN needs one: resnet18 or a model of your own)"

    def personal_indices(self, model: Any) -> list[int]:
        from flower_pfl.algorithms.fedbn_math import batchnorm_indices

        return batchnorm_indices(model)
