"""pFedHN client (Shamsian et al., "Personalized Federated Learning using Hypernetworks",
ICML 2021).

The server's hypernetwork generated this client's model theta_i = h(v_i; phi) and sent it.
The client trains it for the configured local steps and uploads the trained theta~_i; the
server turns theta_i - theta~_i into the hypernetwork's gradient (strategies/pfedhn.py).
Its personalized model is the generated theta_i (pFedHN evaluates h(v_i) itself).
The client also keeps theta~_i in ``context.state``: PLGU-GHN's scores need it.
"""

from __future__ import annotations

from flwr.common import NDArrays

from flower_pfl.catalog import plgu
from flower_pfl.catalog.plgu import SAMFit
from flower_pfl.clients.base import MessageConfig, Metrics, PFLClient
from flower_pfl.clients.fedsam import LWSAMClientMixin, layer_tensors
from flower_pfl.learning.models import NamedLayers, get_arrays
from flower_pfl.registry import client_for


@client_for(plgu.PFEDHN)
class PFedHNClient(LWSAMClientMixin, PFLClient):
    def scales(self, generated: NDArrays, model: NamedLayers) -> list[float]:
        """Lambda per layer: pFedHN runs plain SGD (rho = 0), so any value works."""
        return [1.0] * len(model.layer_names())

    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        model = self.new_model(parameters)
        layers = layer_tensors(model)
        lam = self.scales(parameters, model)
        tensors = [p for layer in layers for p in layer]
        per_tensor = [s for layer, s in zip(layers, lam) for _ in layer]
        metrics = self.lwsam_train(model, tensors, per_tensor, SAMFit.from_config(config).rho)
        trained = get_arrays(model)
        self.state.set_arrays("trained", trained)
        return trained, metrics

    def personal_model(self, parameters: NDArrays, config: MessageConfig
                       ) -> NamedLayers:
        return self.new_model(parameters)
