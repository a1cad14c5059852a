"""Per-FedAvg client -- Fallah, Mokhtari & Ozdaglar, NeurIPS 2020, Algorithm 1.

Local training from the global model w: tau meta-updates, each on fresh, distinct
mini-batches (``baselines_math.perfedavg_step``):
    w_tmp = w - alpha grad f(w; D);  FO: w <- w - beta grad f(w_tmp; D')
                                     HF: w <- w - beta (I - alpha H(w; D'')) grad f(w_tmp; D')
beta = train.lr; alpha, delta and the variant come from the server.  D, D', D'' are
consecutive batches of the seeded shuffled passes of training.batches.

tau: ``train.steps`` if set; otherwise one epoch is one pass over the data, so an epoch
gives ceil(n / (2B)) FO or ceil(n / (3B)) HF meta-updates (each consumes 2 or 3 batches).

Personalized evaluation (Per-FedAvg-P): from the global model, ``personal-steps`` SGD
steps of size alpha on the client's TRAINING data (``training.train``), then the test
split; the global model itself is Per-FedAvg-G.  A held-out newcomer (docs/newcomers.md)
adapts the same way with the newcomer budget's steps.
"""

from __future__ import annotations

from flwr.common import NDArrays
from torch.nn import functional as F

from flower_pfl.algorithms.baselines_math import batches_per_step, perfedavg_step
from flower_pfl.catalog import baselines
from flower_pfl.catalog.baselines import PerFedAvgEval, PerFedAvgFit
from flower_pfl.clients.base import NEWCOMER_SALT, MessageConfig, Metrics
from flower_pfl.clients.fedavg import FedAvgClient
from flower_pfl.learning.models import NamedLayers, get_arrays
from flower_pfl.learning.training import batches
from flower_pfl.registry import client_for


@client_for(baselines.PERFEDAVG)
class PerFedAvgClient(FedAvgClient):
    def meta_steps(self, per_step: int) -> int:
        if self.spec.steps is not None:
            return self.spec.steps
        return self.spec.epochs * self.spec.steps_per_pass(self.data.num_train, per_step)

    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        model = self.new_model(parameters).train()
        sent = PerFedAvgFit.from_config(config)
        variant = sent.variant
        k = batches_per_step(variant)
        tau = self.meta_steps(k)
        x, y = self.data.x_train, self.data.y_train
        stream = batches(len(y), self.spec.batch_size, tau * k, self.generator(),
                         self.spec.drop_last)
        total = 0.0
        for _ in range(tau):
            group = [next(stream) for _ in range(k)]
            data = [(x[i].to(self.device), y[i].to(self.device)) for i in group]
            total += perfedavg_step(model, data, sent.alpha, self.spec.lr,
                                    variant, F.cross_entropy, sent.delta)
        return get_arrays(model), {"train_loss": total / tau, "local_steps": float(tau)}

    def personal_model(self, parameters: NDArrays, config: MessageConfig
                       ) -> NamedLayers:
        model = self.new_model(parameters)
        sent = PerFedAvgEval.from_config(config)
        self.local_train(model, num_steps=sent.personal_steps, salt=1, lr=sent.alpha)
        return model

    def adapt_newcomer(self, model: NamedLayers, config: MessageConfig, steps: int
                       ) -> NamedLayers:
        """Per-FedAvg's few-step adaptation for a newcomer: ``steps`` SGD steps of size
        alpha (:class:`PerFedAvgEval`) from the meta-model ``model``."""
        self.local_train(model, num_steps=steps, salt=NEWCOMER_SALT,
                         lr=PerFedAvgEval.from_config(config).alpha)
        return model
