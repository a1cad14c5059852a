"""LG-FedAvg client (Liang et al. 2020, Algorithm 1, client side): FedPer's client
(clients/fedper.py) keeping the body -- its local representation -- and trading the head
(the global layers).

One round: receive the global head theta^g; assemble (its own body, theta^g); train both
jointly with the run's local SGD on the data loss (the paper's supervised objective;
its auxiliary representation losses are not part of this method); keep the body, upload
the head. Its personalized model is (its body, the current global head).
"""

from __future__ import annotations

from flower_pfl.catalog import lgfedavg
from flower_pfl.clients.fedper import PersonalPartClient
from flower_pfl.learning.models import NamedLayers, head_split
from flower_pfl.registry import client_for


@client_for(lgfedavg.LG_FEDAVG)
class LGFedAvgClient(PersonalPartClient):
    part = "body"

    def personal_indices(self, model: NamedLayers) -> list[int]:
        return head_split(model)[1]
