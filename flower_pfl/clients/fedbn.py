"""FedBN client (Li et al., ICLR 2021, Algorithm 1, client side): FedPer's client
(clients/fedper.py) keeping every BatchNorm layer -- its weight, bias, running mean and
running variance (``algorithms.fedbn_math.batchnorm_indices``) -- and trading the rest.

One round: receive the averaged non-BatchNorm layers; assemble them with its own BatchNorm
layers; train the whole model with the run's local SGD (BatchNorm in training mode: its
running statistics follow this client's batches); keep the BatchNorm layers, upload the
rest. Its personalized model is (the current global layers, its BatchNorm layers).
"""

from __future__ import annotations

from flower_pfl.algorithms.fedbn_math import batchnorm_indices
from flower_pfl.catalog import fedbn
from flower_pfl.clients.fedper import PersonalPartClient
from flower_pfl.learning.models import NamedLayers
from flower_pfl.registry import client_for


@client_for(fedbn.FEDBN)
class FedBNClient(PersonalPartClient):
    part = "batchnorm"

    def personal_indices(self, model: NamedLayers) -> list[int]:
        return batchnorm_indices(model)
