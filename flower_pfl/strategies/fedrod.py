"""FedRoD -- Chen & Chao, ICLR 2022 (server side).

The server is FedAvg's: the body and the generic head (the whole model the clients upload)
become their sample-weighted mean each round; the personal heads never leave the clients
(clients/fedrod.py).  The global model is FedRoD's generic model (G-FL), evaluated beside
each client's personalized one (P-FL: generic + personal logits).
"""

from __future__ import annotations

from flower_pfl.catalog import fedrod as catalog
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.fedavg import FedAvg


@strategy_for(catalog.FEDROD)
class FedRoD(FedAvg):
    """FedAvg's sample-weighted mean of the uploaded bodies and generic heads."""
