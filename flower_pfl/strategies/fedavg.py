"""FedAvg (McMahan et al., AISTATS 2017) and FedAvg + local fine-tuning (FedAvg-FT).

Global update: w <- sum_i (n_i / n) w_i over the clients of the round (Algorithm 1 of
McMahan et al.).  FedAvg-FT (the fine-tuning baseline of FedAMP's tables) trains the
same way; its clients fine-tune the global model before personalized evaluation.
"""

from __future__ import annotations

from typing import Mapping

from flwr.common import Scalar

from flower_pfl.algorithms.fedavg_math import weighted_average
from flower_pfl.catalog import baselines as catalog
from flower_pfl.catalog.baselines import FineTuneEval
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.base import PersonalizedStrategy
from flower_pfl.strategies.federation import ClientUpdate


@strategy_for(catalog.FEDAVG)
class FedAvg(PersonalizedStrategy):
    """Sample-weighted mean of the sampled clients' models."""

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        self.global_arrays = weighted_average([u.arrays for u in updates],
                                              [u.num_examples for u in updates])


@strategy_for(catalog.FEDAVG_FT)
class FedAvgFT(FedAvg):
    """FedAvg whose clients fine-tune the global model before personalized evaluation."""

    params: catalog.FedAvgFTParams

    def eval_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        return FineTuneEval(finetune_steps=self.params.finetune_steps).to_config()
