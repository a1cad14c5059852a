"""LG-FedAvg (Liang et al. 2020) server: FedPer's server (strategies/fedper.py) with the
roles of the two parts swapped.

Algorithm 1 (server side): the global parameters theta^g -- here the model's head
(``learning.layers.head_split``: the built-ins' last layer, a user model's declared head) --
are sent to the round's clients and replaced by the weighted mean sum_m (n_m / n)
theta^g_m of what they upload; each client's local representation (every other layer)
never reaches the server (clients/lgfedavg.py). A model that is all head (mclr) has no
local representation: LG-FedAvg is then FedAvg (WARNING).
"""

from __future__ import annotations

from typing import Any

from flower_pfl.catalog import lgfedavg as catalog
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.fedper import SharedPart


@strategy_for(catalog.LG_FEDAVG)
class LGFedAvg(SharedPart):
    """The head averaged; the body (local representation) never leaves a client."""

    personal_part = "local representation (the model is all head)"

    def personal_indices(self, model: Any) -> list[int]:
        from flower_pfl.learning.models import head_split

        return head_split(model)[1]
