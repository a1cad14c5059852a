"""PLGU clients (Qu et al., CVPR 2023): PLGU-LF (Algorithm 2 + Algorithm 1), PLGU-GRep
(Algorithm 3, eqs. 9-13) and PLGU-GHN (PLGU on pFedHN).

PLGU-LF, one round of sampled client i (Algorithm 2, lines 6-10):
  6  xi_i by eq. 6 between its personal model theta_i^t and the global w^t, over the
     parameters (BatchNorm running statistics are not scored; no personal model yet:
     theta_i^t = w^t, all distances 0, uniform scores);
     Lambda_i = diag(L * xi_i) (flower_pfl/algorithms/plgu_math.py: uniform = SAM, ||eps|| = rho)
  7  L^Per = the D layers with the largest xi, L^Uni = the others
  8  theta~^0: L^Uni layers <- w^t, L^Per layers <- theta_i^t (kept local: "frozen")
  9  Algorithm 1, ``reading: two-model`` (the default, as printed): theta~ and a global copy
     w~^0 = w^t; each step theta~ takes plain SGD, w~ the LWSAM gradient at theta~ + eps,
     eps over ALL layers (flower_pfl/plgu_math.two_model_train); with BatchNorm w~ also
     runs forward on each batch, so its running statistics follow the data
  10 upload Delta = w~^K - w~^0 of every layer; keep theta~^K as theta_i^{t+1}.
  ``reading: one-model`` (the other reading): Algorithm 1's two outputs are the L^Per and
  L^Uni parts of ONE model theta~: the personal layers take the plain step, the universal
  layers the LWSAM step (eps on the universal layers only); Delta of the universal layers
  only (a mask says which arrays are shared).  Limits (tested): |L^Per| = 0 is FedSAM
  (while Lambda = I), |L^Per| = L is Local.

PLGU-GRep: FedRep (clients/fedrep.py; the head: the last ``head_count`` layer groups, one or
  several) whose body update is Algorithm 1 with Lambda from eq. 10
  (``reading: two-model``: the body phi~ by plain SGD, a copy w~ by the LWSAM gradient at
  phi~ + eps, w~ uploaded as the generalized representation; ``one-model``: one LWSAM body),
  xi_l = ||phi_{i,l} - phi_l|| / dim(phi_l) over the body layers, phi_i the body this client
  uploaded last time, phi the received global body. rho = 0 is FedRep (tested).

PLGU-GHN (our reading; the paper defers it to a supplement we do not have): pFedHN whose
  client trains the generated model theta_i with LWSAM instead of SGD, Lambda from the
  eq. 6 scores between the client's last trained model theta~_i and the newly generated
  theta_i (the layers where the client pulls hardest away from what the shared hypernetwork
  generates get the most perturbation), so the delta that trains the hypernetwork -- the
  universal part -- comes from a flatter neighbourhood; the embedding v_i stays the
  personal part. rho = 0 is pFedHN (tested).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from flwr.common import NDArrays

from flower_pfl.algorithms import plgu_math as pm
from flower_pfl.catalog import plgu
from flower_pfl.catalog.plgu import FedRepFit, PLGUFit, PLGUReply
from flower_pfl.clients.base import MessageConfig, Metrics, PFLClient
from flower_pfl.clients.fedrep import FedRepClient
from flower_pfl.clients.fedsam import (
    LWSAMClientMixin,
    deltas,
    layer_tensors,
    parameter_groups,
    per_layer,
)
from flower_pfl.clients.pfedhn import PFedHNClient
from flower_pfl.learning.models import NamedLayers, get_arrays, head_count
from flower_pfl.registry import client_for


@client_for(plgu.PLGU_LF)
class PLGULFClient(LWSAMClientMixin, PFLClient):
    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        template = self.new_model(parameters)
        groups = self.groups(template)
        personal = self.state.get_arrays("personal")
        if personal is None:
            personal = [np.array(a, copy=True) for a in parameters]
        scored = parameter_groups(template)  # eq. 6 over parameters (not BN statistics)
        xi = pm.layer_scores(per_layer(personal, scored), per_layer(parameters, scored))  # 6
        lam = pm.lwsam_scaling(xi)
        sent = PLGUFit.from_config(config)
        per, uni = pm.split_layers(xi, sent.personal_layers)  # line 7
        start = [np.array(a, copy=True) for a in parameters]  # line 8
        for l in per:
            for i in groups[l][1]:
                start[i] = personal[i]
        model = self.new_model(start)
        layers = layer_tensors(model)
        rho = sent.rho
        if sent.reading == "two-model":  # line 9: Algorithm 1 as printed
            w_model = self.new_model(parameters)  # w~^0 = w^t
            theta = [p for layer in layers for p in layer]
            w = [p for layer in layer_tensors(w_model) for p in layer]
            scales = [float(lam[l]) for l, layer in enumerate(layers) for _ in layer]
            metrics = self.two_model_train(model, theta, w, scales, rho, w_model=w_model)
            shared = np.ones(len(start), dtype=bool)
            delta = deltas(get_arrays(w_model), parameters)  # line 10: the whole w~
        else:  # one-model reading
            perturbed = [p for l in uni for p in layers[l]]
            scales = [float(lam[l]) for l in uni for _ in layers[l]]
            plain = [p for l in per for p in layers[l]]
            metrics = self.lwsam_train(model, perturbed, scales, rho, plain=plain)
            shared = np.zeros(len(start), dtype=bool)
            for l in uni:
                shared[groups[l][1]] = True
            delta = deltas(get_arrays(model), start)  # universal layers start at w^t
        trained = get_arrays(model)
        self.state.set_arrays("personal", trained)
        upload = [d if s else np.zeros_like(d) for d, s in zip(delta, shared)]
        return upload, {**metrics, **PLGUReply(
            shared="".join("1" if s else "0" for s in shared),
            personal_layers=",".join(groups[l][0] for l in per),
            xi_max=float(xi.max()), xi_min=float(xi.min())).to_config()}

    def personal_model(self, parameters: NDArrays, config: MessageConfig
                       ) -> NamedLayers:
        model = self.load_personal()
        return model if model is not None else self.new_model(parameters)


@client_for(plgu.PLGU_GREP)
class PLGUGRepClient(FedRepClient):
    def train_body(self, model: NamedLayers, body_layers: Sequence[Sequence[torch.Tensor]],
                   scales: Sequence[float], rho: float, num_steps: int, config: MessageConfig
                   ) -> tuple[dict[str, float], list[np.ndarray]]:
        """``reading: two-model``: Algorithm 1 on the body -- phi~ (in ``model``) by plain
        SGD, a copy w~ of the received body by the LWSAM gradient at phi~ + eps; w~ (the
        generalized representation) is uploaded.  ``one-model``: FedRep's LWSAM body."""
        if FedRepFit.from_config(config).reading != "two-model" or not body_layers:  # (mclr)
            return super().train_body(model, body_layers, scales, rho, num_steps, config)
        w_model = self.new_model(get_arrays(model))
        w_layers = layer_tensors(w_model)[:-head_count(w_model)]
        theta = [p for layer in body_layers for p in layer]
        w = [p for layer in w_layers for p in layer]
        per_tensor = [s for layer, s in zip(body_layers, scales) for _ in layer]
        metrics = self.two_model_train(model, theta, w, per_tensor, rho, num_steps=num_steps,
                                       salt=1, w_model=w_model)
        arrays = get_arrays(w_model)
        return metrics, [arrays[i] for i in self.split(w_model)[1]]

    def body_scales(self, received_body: NDArrays,
                    body_layers: Sequence[Sequence[torch.Tensor]]) -> list[float]:
        """Eq. 10 over the body layers, Lambda = L_phi * xi (uniform on first participation)."""
        if not body_layers:
            return []
        model = self.new_model()
        heads = head_count(model)
        groups = self.groups(model)[:-heads]
        scored = parameter_groups(model)[:-heads]  # eq. 10 over parameters (not BN statistics)
        # body arrays are the get_arrays entries of the body groups, in order
        offsets: list[list[int]] = []
        pos = 0
        for (_, idx), (_, params) in zip(groups, scored):
            offsets.append([pos + j for j, i in enumerate(idx) if i in params])
            pos += len(idx)
        mine = self.state.get_arrays("body")
        if mine is None:
            mine = received_body

        def split(arrays: Sequence[np.ndarray]) -> list[list[np.ndarray]]:  # by offsets
            return [[arrays[i] for i in idx] for idx in offsets]

        return [float(v) for v in pm.lwsam_scaling(pm.layer_scores(split(mine),
                                                                    split(received_body)))]


@client_for(plgu.PLGU_GHN)
class PLGUGHNClient(PFedHNClient):
    def scales(self, generated: NDArrays, model: NamedLayers) -> list[float]:
        """Eq. 6 between the last trained model and the generated one; Lambda = L * xi."""
        groups = parameter_groups(model)  # eq. 6 over parameters (not BN statistics)
        trained = self.state.get_arrays("trained")
        if trained is None:
            trained = generated
        xi = pm.layer_scores(per_layer(trained, groups), per_layer(generated, groups))
        return [float(v) for v in pm.lwsam_scaling(xi)]
