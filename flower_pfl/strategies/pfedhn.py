"""pFedHN (Shamsian et al., "Personalized Federated Learning using Hypernetworks", ICML
2021) server: the hypernetwork and the client embeddings live here.

theta_i = h(v_i; phi): a 3-layer MLP (flower_pfl/algorithms/plgu_math.py, HyperNetwork) maps
client i's learned embedding v_i (kept in the ClientStore, ``embedding``) to the flat parameters of
its model. Each round: generate theta_i for every sampled client and send it; the client
trains it and returns theta~_i; the server computes, per client, the gradient of
<theta_i, theta_i - theta~_i> w.r.t. phi and v_i (pFedHN's update: back-propagating the
client's delta through the hypernetwork), moves v_i by ``embed-lr`` times its own gradient
and phi by ``hn-lr`` times the MEAN of the round's phi-gradients (pFedHN updates after
every single client; with several clients per round we average, so ``hn-lr`` = 1 moves the
output layer's bias -- the shared part of every theta_i -- by the mean client delta, as
FedAvg moves its global model). Plain SGD on phi and v (no momentum, nothing to store but
the weights). Personalized evaluation: every client evaluates its generated h(v_i).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
from flwr.common import Scalar

from flower_pfl.catalog import plgu as catalog
from flower_pfl.catalog.plgu import SAMFit
from flower_pfl.registry import strategy_for
from flower_pfl.strategies.base import ClientUpdate, PersonalizedStrategy

if TYPE_CHECKING:  # the hypernetwork is torch: imported where it is built and used, so that
    # importing the strategy modules stays torch-free (flower_pfl/strategies/index.py)
    from flower_pfl.algorithms.plgu_math import HyperNetwork


@strategy_for(catalog.PFEDHN)
class PFedHN(PersonalizedStrategy):
    has_global_model = False
    params: catalog.PFedHNParams
    #: the hypernetwork (the client embeddings v_i are in the ClientStore)
    checkpointed = ("hn",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hn: HyperNetwork | None = None  # built by setup from the initial model

    def rho(self) -> float:
        return 0.0

    def setup(self, initial_arrays: list[np.ndarray]) -> None:
        import torch

        from flower_pfl.algorithms import plgu_math as pm

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.cfg["seed"]) + 0x4E)
            self.hn = pm.HyperNetwork(self.params.embed_dim, self.params.hidden,
                                      self.spec.flatten(initial_arrays).astype(np.float32))
        for pid in range(self.num_clients):
            self.store.put("embedding", pid, pm.init_embedding(self.params.embed_dim,
                                                               int(self.cfg["seed"]), pid))

    def generate(self, pid: int) -> list[np.ndarray]:
        import torch

        with torch.no_grad():
            v = torch.as_tensor(self.store.get("embedding", pid))
            assert self.hn is not None, "setup builds the hypernetwork before round 1"
            return self.spec.unflatten(self.hn(v).numpy().astype(np.float32))

    def fit_payload(self, pid: int, server_round: int
                    ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        return self.generate(pid), SAMFit(rho=self.rho()).to_config()

    def aggregate_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        import torch

        from flower_pfl.algorithms import plgu_math as pm

        hn = self.hn
        assert hn is not None, "setup builds the hypernetwork before round 1"
        params = list(hn.parameters())
        total = [torch.zeros_like(p) for p in params]
        delta_norms = []
        for u in updates:
            v = torch.as_tensor(self.store.get("embedding", u.pid))
            trained = torch.as_tensor(self.spec.flatten(u.arrays).astype(np.float32))
            grads, g_v = pm.hypernetwork_grads(hn, v, trained)
            for t, g in zip(total, grads):
                t.add_(g)
            self.store.put("embedding", u.pid,
                           (v - self.params.embed_lr * g_v).numpy().astype(np.float32))
            delta_norms.append(float(grads[-1].norm()))  # output bias grad = theta - theta~
        with torch.no_grad():
            for p, t in zip(params, total):
                p.sub_(self.params.hn_lr * t / len(updates))
        self.log_server(client_delta_norm_mean=float(np.mean(delta_norms)))

    def eval_payload(self, pid: int, server_round: int
                     ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        return self.generate(pid), {}
