"""FedBABU client (Oh, Kim & Yun, ICLR 2022, Algorithm 1, client side).

Federated training: start from the global model (the body averaged, the head the server's
random initialisation), freeze the head (``requires_grad`` off: no gradient, no momentum,
no weight decay reaches it) and run the run's local SGD on the body alone; upload the whole
model, whose head is the one received, byte for byte. Personalization (evaluation): the
global model fine-tuned, whole, for tau = ``finetune-epochs`` passes over the client's
training data (FedBABU's default: body and head); not kept, the next round starts from the
global model again.
"""

from __future__ import annotations

import torch
from flwr.common import NDArrays

from flower_pfl.catalog import fedbabu
from flower_pfl.catalog.fedbabu import FedBABUEval
from flower_pfl.clients.base import MessageConfig, Metrics, PFLClient
from flower_pfl.learning.models import NamedLayers, get_arrays, head_split
from flower_pfl.registry import client_for


@client_for(fedbabu.FEDBABU)
class FedBABUClient(PFLClient):
    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        model = self.new_model(parameters)
        keys = [k for k, v in model.state_dict().items() if v.is_floating_point()]
        head = {keys[i] for i in head_split(model)[0]}
        for name, p in model.named_parameters():
            p.requires_grad_(name not in head)
        if any(p.requires_grad for p in model.parameters()):
            metrics = self.local_train(model)
        else:  # all head (mclr): nothing to train; report the data loss it has
            with torch.no_grad():
                x = self.data.x_train[:self.data.num_train].to(self.device)
                loss = self.loss_fn()(model(x), self.data.y_train.to(self.device))
            metrics = {"train_loss": float(loss), "local_steps": 0.0}
        return get_arrays(model), metrics

    def personal_model(self, parameters: NDArrays, config: MessageConfig) -> NamedLayers:
        model = self.new_model(parameters)
        epochs = FedBABUEval.from_config(config).finetune_epochs
        self.local_train(model, salt=1,
                         num_steps=epochs * self.spec.steps_per_pass(self.data.num_train))
        return model
